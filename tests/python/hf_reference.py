"""The Hugging Face conventions, written out in PyTorch, against `runner export`'s files.

usage: hf_reference.py EXPORT_DIR NPZ_DIR TOKENS_FILE LOGITS_FILE B T
       hf_reference.py make MODEL_DIR gpt2|llama [key=value ...]   (runner import's input, random weights)
       hf_reference.py logits MODEL_DIR TOKENS_FILE LOGITS_FILE B T  (an imported model's logits)
       hf_reference.py loss MODEL_DIR TOKEN T                        (mean loss of T copies of TOKEN)

Reads EXPORT_DIR/model.safetensors with the reader below (an 8-byte little-endian header
length, the JSON header, raw little-endian tensors; no safetensors package), builds
GPT2LMHeadModel's or LlamaForCausalLM's forward pass from config.json in the conventions of
those models (GPT-2: Conv1D weights (in, out), tanh gelu "gelu_new", tied embeddings, learned
positions; Llama: rmsnorm, q/k/v and gate/up projections, silu, rotate-half rope), runs it in
fp32 on the B x T int32 tokens and compares with the runner's fp32 logits (B*T x vocab).
It also reads NPZ_DIR/model.npz with numpy and checks that every Hugging Face tensor is the
runner's logical tensor it came from (fused q|k|v and gate|up rows, transposed Conv1D).
Prints the largest difference and exits 1 when it is over 1e-5.

`make` writes a Hugging Face model directory for `runner import` with random weights: config.json
and the safetensors file(s) written by hand (python3-safetensors is not installed), in F32, BF16
or F16, one file or shards with model.safetensors.index.json; the tensor names and shapes are
the Hugging Face conventions (GPT-2's Conv1D (in, out); Llama's q/k/v with num_key_value_heads).
`logits` runs those files through the same forward passes and compares with the runner's logits
of the imported model.
"""
import json
import math
import os
import struct
import sys



def openblas_coretype():  # as bench/torch_gpt.py: OpenBLAS 0.3.21 misreads newer Xeons; read when it loads
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(next((l.split(":", 1)[1].split() for l in f if l.startswith("flags")), []))
    except OSError:
        return None
    if {"avx512f", "avx512bw", "avx512vl"} <= flags:
        return "SkylakeX"
    return "Haswell" if {"avx2", "fma"} <= flags else None


if "OPENBLAS_CORETYPE" not in os.environ and openblas_coretype():
    os.environ["OPENBLAS_CORETYPE"] = openblas_coretype()
    os.execv(sys.executable, [sys.executable] + sys.argv)

import numpy as np  # noqa: E402
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from common import read_safetensors as read_safetensors_np  # noqa: E402  (the reader bench/generate.py uses too)
if sys.argv[1:2] == ["make"]:  # writing files needs no torch (whose import takes seconds)
    torch = None
else:
    import torch  # noqa: E402
    torch.set_num_threads(1)


def read_safetensors(path):
    return {k: torch.from_numpy(v) for k, v in read_safetensors_np(path).items()}


def read_model(model_dir):
    """Every tensor of a model directory: model.safetensors, or the shards its index names (GPT2Model's
    bare names read as GPT2LMHeadModel's)."""
    w = read_files(model_dir)
    return {("transformer." + k if k.split(".")[0] in ("wte", "wpe", "h", "ln_f") else k): v for k, v in w.items()}


def read_files(model_dir):
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if not os.path.exists(index):
        return read_safetensors(os.path.join(model_dir, "model.safetensors"))
    with open(index) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    w = {}
    for fn in files:
        w.update(read_safetensors(os.path.join(model_dir, fn)))
    return w


def st_bytes(arr, dtype):
    """A tensor's raw little-endian bytes in the safetensors dtype."""
    a = np.ascontiguousarray(arr, dtype=np.float32)
    if dtype == "F64":
        return a.astype("<f8").tobytes()
    if dtype == "F32":
        return a.astype("<f4").tobytes()
    if dtype == "F16":
        return a.astype("<f2").tobytes()
    u = a.view(np.uint32).astype(np.uint64)  # bf16: round to nearest even
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")
    return u.tobytes()


def write_safetensors(path, tensors, dtype, metadata=None):
    """The format by hand: 8-byte little-endian header length, the JSON header, the raw data."""
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, arr in tensors:
        b = st_bytes(arr, dtype)
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def hf_tensors_of(cfg):
    """(name, shape) of every tensor of a GPT2LMHeadModel / LlamaForCausalLM, Hugging Face order."""
    out = []
    if cfg["model_type"] == "gpt2":
        C, V, L, I = cfg["n_embd"], cfg["vocab_size"], cfg["n_layer"], cfg.get("n_inner") or 4 * cfg["n_embd"]
        out += [("transformer.wte.weight", (V, C)), ("transformer.wpe.weight", (cfg["n_positions"], C))]
        for l in range(L):
            p = f"transformer.h.{l}"
            out += [(p + ".ln_1.weight", (C,)), (p + ".ln_1.bias", (C,)), (p + ".attn.c_attn.weight", (C, 3 * C)),
                    (p + ".attn.c_attn.bias", (3 * C,)), (p + ".attn.c_proj.weight", (C, C)), (p + ".attn.c_proj.bias", (C,)),
                    (p + ".ln_2.weight", (C,)), (p + ".ln_2.bias", (C,)), (p + ".mlp.c_fc.weight", (C, I)),
                    (p + ".mlp.c_fc.bias", (I,)), (p + ".mlp.c_proj.weight", (I, C)), (p + ".mlp.c_proj.bias", (C,))]
        out += [("transformer.ln_f.weight", (C,)), ("transformer.ln_f.bias", (C,))]
    else:
        C, V, L, I = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]
        NH, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        KVC, bias = KV * (C // NH), cfg["attention_bias"]
        out.append(("model.embed_tokens.weight", (V, C)))
        for l in range(L):
            p = f"model.layers.{l}"
            out.append((p + ".input_layernorm.weight", (C,)))
            for n, rows in (("q", C), ("k", KVC), ("v", KVC), ("o", C)):
                out.append((f"{p}.self_attn.{n}_proj.weight", (rows, C)))
                if bias:
                    out.append((f"{p}.self_attn.{n}_proj.bias", (rows,)))
            out.append((p + ".post_attention_layernorm.weight", (C,)))
            for n, shape in (("gate", (I, C)), ("up", (I, C)), ("down", (C, I))):
                out.append((f"{p}.mlp.{n}_proj.weight", shape))
                if bias:
                    out.append((f"{p}.mlp.{n}_proj.bias", (shape[0],)))
        out.append(("model.norm.weight", (C,)))
    if not cfg["tie_word_embeddings"]:
        out.append(("lm_head.weight", (V, C)))
    return out


def bytes_to_unicode():
    """GPT-2's byte -> printable character table (the byte-level BPE's alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + \
        list(range(ord("\u00ae"), ord("\u00ff") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def write_gpt2_tokenizer(model_dir):
    """A tiny GPT-2 style tokenizer: the 256 byte tokens, two merges, <|endoftext|> (259 ids)."""
    vocab = {c: i for i, c in enumerate(bytes_to_unicode().values())}
    merges = [("\u0120", "t"), ("h", "e")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    with open(os.path.join(model_dir, "vocab.json"), "w") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(model_dir, "merges.txt"), "w") as f:
        f.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    with open(os.path.join(model_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}, f)


def make_model(model_dir, arch, opts):
    """A small random model in the Hugging Face layout. opts: dtype (F32|BF16|F16|F64), shards, kv_heads,
    tie, bias, seed, vocab, layers, d_model, heads, inner, seq_len; drop (a tensor left out), tok=1 (a tiny
    GPT-2 tokenizer beside the weights), bare=1 (GPT2Model's names, without "transformer.", as the hub's gpt2)."""
    o = dict(dtype="F32", shards="1", kv_heads="0", tie="1" if arch == "gpt2" else "0", bias="0", seed="1",
             vocab="96", layers="2", d_model="32", heads="4", inner="0", seq_len="16", drop="", tok="0", bare="0")
    o.update(opts)
    C, NH = int(o["d_model"]), int(o["heads"])
    I = int(o["inner"]) or (4 * C if arch == "gpt2" else 3 * C)
    if arch == "gpt2":
        cfg = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": int(o["vocab"]),
               "n_positions": int(o["seq_len"]), "n_ctx": int(o["seq_len"]), "n_embd": C, "n_layer": int(o["layers"]),
               "n_head": NH, "n_inner": I, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
               "tie_word_embeddings": o["tie"] == "1"}
    else:
        cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": int(o["vocab"]),
               "hidden_size": C, "intermediate_size": I, "num_hidden_layers": int(o["layers"]),
               "num_attention_heads": NH, "num_key_value_heads": int(o["kv_heads"]) or NH, "hidden_act": "silu",
               "max_position_embeddings": int(o["seq_len"]), "rms_norm_eps": 1e-6, "rope_theta": 500000.0,
               "attention_bias": o["bias"] == "1", "mlp_bias": o["bias"] == "1", "tie_word_embeddings": o["tie"] == "1"}
    rng = np.random.default_rng(int(o["seed"]))
    tensors = []
    for name, shape in hf_tensors_of(cfg):
        norm = name.endswith("norm.weight") or ".ln_" in name or "ln_f" in name
        a = (1.0 + 0.1 * rng.standard_normal(shape)) if norm and name.endswith("weight") else 0.2 * rng.standard_normal(shape)
        if name != o["drop"]:
            tensors.append((name[len("transformer."):] if o["bare"] == "1" and name.startswith("transformer.") else name,
                            a.astype(np.float32)))
    os.makedirs(model_dir, exist_ok=True)
    if o["tok"] == "1":
        write_gpt2_tokenizer(model_dir)
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    shards = int(o["shards"])
    if shards == 1:
        write_safetensors(os.path.join(model_dir, "model.safetensors"), tensors, o["dtype"], {"format": "pt"})
        return
    weight_map = {}
    for k in range(shards):
        fn = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = tensors[k::shards]
        write_safetensors(os.path.join(model_dir, fn), part, o["dtype"])
        weight_map.update({n: fn for n, _ in part})
    with open(os.path.join(model_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=2)


def gpt2_forward(cfg, w, tokens):
    B, T = tokens.shape
    C, NH = cfg["n_embd"], cfg["n_head"]
    HS = C // NH
    eps = cfg["layer_norm_epsilon"]
    assert cfg["activation_function"] == "gelu_new"
    x = w["transformer.wte.weight"][tokens] + w["transformer.wpe.weight"][torch.arange(T)]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))

    def conv1d(x, p):  # Conv1D: y = x @ W + b, W stored (in, out)
        return x @ w[p + ".weight"] + w[p + ".bias"]

    def ln(x, p):
        return torch.nn.functional.layer_norm(x, (C,), w[p + ".weight"], w[p + ".bias"], eps)

    for l in range(cfg["n_layer"]):
        p = f"transformer.h.{l}"
        qkv = conv1d(ln(x, p + ".ln_1"), p + ".attn.c_attn")
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (t.view(B, T, NH, HS).transpose(1, 2) for t in (q, k, v))
        s = (q @ k.transpose(-1, -2)) / math.sqrt(HS)
        s = s.masked_fill(~mask, float("-inf"))
        y = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + conv1d(y, p + ".attn.c_proj")
        h = conv1d(ln(x, p + ".ln_2"), p + ".mlp.c_fc")
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h ** 3)))  # gelu_new
        x = x + conv1d(h, p + ".mlp.c_proj")
    x = ln(x, "transformer.ln_f")
    head = w["transformer.wte.weight"] if cfg["tie_word_embeddings"] else w["lm_head.weight"]
    return x @ head.T


def llama_forward(cfg, w, tokens):
    B, T = tokens.shape
    C, NH = cfg["hidden_size"], cfg["num_attention_heads"]
    HS = C // NH
    KV = cfg.get("num_key_value_heads", NH)
    assert NH % KV == 0 and cfg["hidden_act"] == "silu"
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    x = w["model.embed_tokens.weight"][tokens]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    inv = 1.0 / (theta ** (torch.arange(0, HS, 2, dtype=torch.float64) / HS))
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    cos, sin = ang.cos().float(), ang.sin().float()

    def rotate_half(t):
        a, b = t[..., : HS // 2], t[..., HS // 2:]
        return torch.cat([-b, a], dim=-1)

    def lin(x, p):
        y = x @ w[p + ".weight"].T
        return y + w[p + ".bias"] if p + ".bias" in w else y

    def rms(x, p):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w[p + ".weight"]

    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}"
        a = rms(x, p + ".input_layernorm")
        q, k, v = (lin(a, f"{p}.self_attn.{n}_proj").view(B, T, -1, HS).transpose(1, 2) for n in "qkv")
        # grouped-query attention (transformers' repeat_kv): key-value head j serves query heads
        # j * NH/KV ... (j + 1) * NH/KV - 1
        k, v = (t.repeat_interleave(NH // KV, dim=1) for t in (k, v))
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        s = (q @ k.transpose(-1, -2)) / math.sqrt(HS)
        s = s.masked_fill(~mask, float("-inf"))
        y = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + lin(y, p + ".self_attn.o_proj")
        m = rms(x, p + ".post_attention_layernorm")
        x = x + lin(torch.nn.functional.silu(lin(m, p + ".mlp.gate_proj")) * lin(m, p + ".mlp.up_proj"), p + ".mlp.down_proj")
    x = rms(x, "model.norm")
    head = w["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else w["lm_head.weight"]
    return x @ head.T


def check_npz(cfg, w, npz_path):
    """Every Hugging Face tensor is exactly the runner's logical tensor it came from."""
    z = np.load(npz_path)
    r = {k: torch.from_numpy(z[k]) for k in z.files}
    pairs = []
    if cfg["model_type"] == "gpt2":
        pairs += [("transformer.wte.weight", r["wte"]), ("transformer.wpe.weight", r["wpe"]),
                  ("transformer.ln_f.weight", r["ln_f.weight"]), ("transformer.ln_f.bias", r["ln_f.bias"])]
        for l in range(cfg["n_layer"]):
            p, q = f"h.{l}", f"transformer.h.{l}"
            for hf, ours, tr in [("ln_1", "ln1", False), ("ln_2", "ln2", False), ("attn.c_attn", "attn.qkv", True),
                                 ("attn.c_proj", "attn.proj", True), ("mlp.c_fc", "mlp.fc", True),
                                 ("mlp.c_proj", "mlp.proj", True)]:
                pairs.append((f"{q}.{hf}.weight", r[f"{p}.{ours}.weight"].T if tr else r[f"{p}.{ours}.weight"]))
                pairs.append((f"{q}.{hf}.bias", r[f"{p}.{ours}.bias"]))
    else:
        C, H = cfg["hidden_size"], cfg["intermediate_size"]
        KVC = cfg.get("num_key_value_heads", cfg["num_attention_heads"]) * (C // cfg["num_attention_heads"])
        pairs += [("model.embed_tokens.weight", r["wte"]), ("model.norm.weight", r["ln_f.weight"])]
        for l in range(cfg["num_hidden_layers"]):
            p, q = f"h.{l}", f"model.layers.{l}"
            qkv, fc = r[f"{p}.attn.qkv.weight"], r[f"{p}.mlp.fc.weight"]
            pairs += [(f"{q}.input_layernorm.weight", r[f"{p}.ln1.weight"]),
                      (f"{q}.post_attention_layernorm.weight", r[f"{p}.ln2.weight"]),
                      (f"{q}.self_attn.q_proj.weight", qkv[:C]), (f"{q}.self_attn.k_proj.weight", qkv[C:C + KVC]),
                      (f"{q}.self_attn.v_proj.weight", qkv[C + KVC:]),
                      (f"{q}.self_attn.o_proj.weight", r[f"{p}.attn.proj.weight"]),
                      (f"{q}.mlp.gate_proj.weight", fc[:H]), (f"{q}.mlp.up_proj.weight", fc[H:]),
                      (f"{q}.mlp.down_proj.weight", r[f"{p}.mlp.proj.weight"])]
    if not cfg["tie_word_embeddings"]:
        pairs.append(("lm_head.weight", r["lm_head.weight"]))
    names = {n for n, _ in pairs}
    assert names == set(w), f"tensor names differ: extra {sorted(set(w) - names)}, missing {sorted(names - set(w))}"
    for n, t in pairs:
        assert torch.equal(w[n], t), f"{n} differs from the runner's tensor"
    return len(pairs)


def forward(cfg, w, tokens):
    with torch.no_grad():
        return gpt2_forward(cfg, w, tokens) if cfg["model_type"] == "gpt2" else llama_forward(cfg, w, tokens)


def imported_logits(model_dir, tokens_file, logits_file, B, T):
    """The Hugging Face files' logits against the runner's logits of the imported model."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    w = read_model(model_dir)
    tokens = torch.from_numpy(np.fromfile(tokens_file, dtype="<i4").astype(np.int64).reshape(B, T))
    ours = torch.from_numpy(np.fromfile(logits_file, dtype="<f4").reshape(B, T, -1))
    ref = forward(cfg, w, tokens)
    diff = (ref - ours).abs().max().item()
    print(f"{cfg['model_type']} (key-value heads {cfg.get('num_key_value_heads', '-')}): max |logit diff| {diff:.3g} "
          f"(logits up to {ref.abs().max().item():.3g})")
    return 0 if diff <= 1e-5 else 1


def constant_loss(model_dir, token, T):
    """Mean next-token cross-entropy of a sequence of T + 1 copies of `token` (every window of a
    constant token file), printed with full precision."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    w = read_model(model_dir)
    x = torch.full((1, T), token, dtype=torch.int64)
    logits = forward(cfg, w, x)
    loss = torch.nn.functional.cross_entropy(logits.reshape(T, -1).double(), x.reshape(T))
    print(f"{loss.item():.10g}")
    return 0


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "make":
        make_model(sys.argv[2], sys.argv[3], dict(kv.split("=", 1) for kv in sys.argv[4:]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "logits":
        sys.exit(imported_logits(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6])))
    if len(sys.argv) > 1 and sys.argv[1] == "loss":
        sys.exit(constant_loss(sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
    export_dir, npz_dir, tokens_file, logits_file, B, T = sys.argv[1:7]
    B, T = int(B), int(T)
    with open(os.path.join(export_dir, "config.json")) as f:
        cfg = json.load(f)
    w = read_safetensors(os.path.join(export_dir, "model.safetensors"))
    n = check_npz(cfg, w, os.path.join(npz_dir, "model.npz"))
    tokens = torch.from_numpy(np.fromfile(tokens_file, dtype="<i4").astype(np.int64).reshape(B, T))
    ours = torch.from_numpy(np.fromfile(logits_file, dtype="<f4").reshape(B, T, -1))
    with torch.no_grad():
        ref = gpt2_forward(cfg, w, tokens) if cfg["model_type"] == "gpt2" else llama_forward(cfg, w, tokens)
    diff = (ref - ours).abs().max().item()
    scale = ref.abs().max().item()
    print(f"{cfg['model_type']}: {n} tensors match the npz; max |logit diff| {diff:.3g} (logits up to {scale:.3g})")
    sys.exit(0 if diff <= 1e-5 else 1)


if __name__ == "__main__":
    main()
