"""The Hugging Face conventions, written out in PyTorch, against `runner export`'s files.

usage: hf_reference.py EXPORT_DIR NPZ_DIR TOKENS_FILE LOGITS_FILE B T

Reads EXPORT_DIR/model.safetensors with the reader below (an 8-byte little-endian header
length, the JSON header, raw little-endian tensors; no safetensors package), builds
GPT2LMHeadModel's or LlamaForCausalLM's forward pass from config.json in the conventions of
those models (GPT-2: Conv1D weights (in, out), tanh gelu "gelu_new", tied embeddings, learned
positions; Llama: rmsnorm, q/k/v and gate/up projections, silu, rotate-half rope), runs it in
fp32 on the B x T int32 tokens and compares with the runner's fp32 logits (B*T x vocab).
It also reads NPZ_DIR/model.npz with numpy and checks that every Hugging Face tensor is the
runner's logical tensor it came from (fused q|k|v and gate|up rows, transposed Conv1D).
Prints the largest difference and exits 1 when it is over 1e-5.
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
import torch  # noqa: E402

torch.set_num_threads(1)


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    dtypes = {"F32": np.float32}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        arr = np.frombuffer(data[b:e], dtype=np.dtype(dtypes[info["dtype"]]).newbyteorder("<"))
        out[name] = torch.from_numpy(arr.reshape(info["shape"]).copy())
    return out


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
    C, NH, NKV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    HS = C // NH
    assert NH % NKV == 0 and cfg["hidden_act"] == "silu"
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
        q = lin(a, f"{p}.self_attn.q_proj").view(B, T, NH, HS).transpose(1, 2)
        # grouped-query attention: each key-value head serves NH / NKV query heads (repeat_kv)
        k, v = (lin(a, f"{p}.self_attn.{n}_proj").view(B, T, NKV, HS).transpose(1, 2).repeat_interleave(NH // NKV, dim=1)
                for n in "kv")
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
        Ckv = cfg["num_key_value_heads"] * (C // cfg["num_attention_heads"])  # k and v rows (grouped-query attention)
        pairs += [("model.embed_tokens.weight", r["wte"]), ("model.norm.weight", r["ln_f.weight"])]
        for l in range(cfg["num_hidden_layers"]):
            p, q = f"h.{l}", f"model.layers.{l}"
            qkv, fc = r[f"{p}.attn.qkv.weight"], r[f"{p}.mlp.fc.weight"]
            pairs += [(f"{q}.input_layernorm.weight", r[f"{p}.ln1.weight"]),
                      (f"{q}.post_attention_layernorm.weight", r[f"{p}.ln2.weight"]),
                      (f"{q}.self_attn.q_proj.weight", qkv[:C]), (f"{q}.self_attn.k_proj.weight", qkv[C:C + Ckv]),
                      (f"{q}.self_attn.v_proj.weight", qkv[C + Ckv:]),
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


def main():
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
