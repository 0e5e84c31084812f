#!/usr/bin/python3
"""Reference fixtures for the C++ GPT model: logits, loss, gradients, 5 AdamW steps.

Usage:  /usr/bin/python3 scripts/make_fixtures.py tests/fixtures

Writes tests/fixtures/gpt_tiny.h5 and tests/fixtures/llama_tiny.h5. The model below is
written out formula by formula in plain PyTorch (no nn.Module, no HF) and evaluated in
float64, so the stored values are the exact math the C++ model must reproduce (to fp32
rounding). docs/fixtures.md describes the file layout.

Architecture (pre-norm GPT-2; every option the recipe exposes):
  x = wte[tokens] (+ wpe[t] when position=learned)
  per layer: x += proj(attn(norm1(x)));  x += mlp(norm2(x))
  logits = norm_f(x) @ Wlm^T  (Wlm = wte when tied, else lm_head.weight)
  loss = mean cross-entropy over positions with target >= 0
The script cross-checks its hand-written pieces against torch built-ins (F.layer_norm,
F.gelu(approximate='tanh'), F.cross_entropy, torch.optim.AdamW + clip_grad_norm_) and
refuses to write a file when they disagree.
"""
import math
import os
import sys

import h5py
import numpy as np
import torch
import torch.nn.functional as F

DT = torch.float64
SEED = 1234

# The optimizer run stored under /trajectory.
TRAJ = dict(steps=5, lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0)
CLIP_FORMULA = ("norm = sqrt(sum over all params of sum(g^2)); "
                "g *= min(1, grad_clip / (norm + 1e-6))  (applied to every gradient, every step, "
                "before the AdamW update; norm is computed on the unclipped gradients)")
ADAMW_FORMULA = ("t = 1..steps; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2; "
                 "mhat = m/(1-b1^t); vhat = v/(1-b2^t); "
                 "p -= lr*(mhat/(sqrt(vhat)+eps) + weight_decay*p)  "
                 "(decoupled decay on ALL params, p on the right is the pre-update value; "
                 "m=v=0 at start; constant lr; same batch every step)")

KBIAS_NOTE = ("rows [C,2C) (the key part) of every h.*.attn.qkv.bias have an analytically ZERO "
              "gradient (softmax is shift-invariant per query row); the stored values there are "
              "float64 round-off (~1e-18). An fp32 implementation gets ~1e-9 noise instead, which "
              "AdamW (eps 1e-8) turns into updates of up to ~0.1*lr: compare that slice (and "
              "/trajectory/params/h.*.attn.qkv.bias) with an absolute tolerance.")

CONFIGS = {
    "gpt_tiny": dict(vocab_size=67, seq_len=8, d_model=32, n_layers=2, n_heads=4, mlp_hidden=128,
                     norm="layernorm", activation="gelu", position="learned",
                     tie_embeddings=True, bias=True, rope_theta=10000.0, norm_eps=1e-5, batch=3),
    "llama_tiny": dict(vocab_size=61, seq_len=8, d_model=32, n_layers=2, n_heads=4, mlp_hidden=64,
                       norm="rmsnorm", activation="swiglu", position="rope",
                       tie_embeddings=False, bias=False, rope_theta=10000.0, norm_eps=1e-5, batch=3),
}


# ---------------------------------------------------------------- parameters

def param_shapes(cfg):
    """Ordered (name, shape, kind) with kind in {weight, norm, bias}."""
    V, T, C, H = cfg["vocab_size"], cfg["seq_len"], cfg["d_model"], cfg["mlp_hidden"]
    ln_bias = cfg["norm"] == "layernorm" and cfg["bias"]
    out = [("wte", (V, C), "weight")]
    if cfg["position"] == "learned":
        out.append(("wpe", (T, C), "weight"))
    fc_rows = 2 * H if cfg["activation"] == "swiglu" else H
    for l in range(cfg["n_layers"]):
        p = f"h.{l}."
        out.append((p + "ln1.weight", (C,), "norm"))
        if ln_bias:
            out.append((p + "ln1.bias", (C,), "bias"))
        out.append((p + "attn.qkv.weight", (3 * C, C), "weight"))
        if cfg["bias"]:
            out.append((p + "attn.qkv.bias", (3 * C,), "bias"))
        out.append((p + "attn.proj.weight", (C, C), "weight"))
        if cfg["bias"]:
            out.append((p + "attn.proj.bias", (C,), "bias"))
        out.append((p + "ln2.weight", (C,), "norm"))
        if ln_bias:
            out.append((p + "ln2.bias", (C,), "bias"))
        out.append((p + "mlp.fc.weight", (fc_rows, C), "weight"))
        if cfg["bias"]:
            out.append((p + "mlp.fc.bias", (fc_rows,), "bias"))
        out.append((p + "mlp.proj.weight", (C, H), "weight"))
        if cfg["bias"]:
            out.append((p + "mlp.proj.bias", (C,), "bias"))
    out.append(("ln_f.weight", (C,), "norm"))
    if ln_bias:
        out.append(("ln_f.bias", (C,), "bias"))
    if not cfg["tie_embeddings"]:
        out.append(("lm_head.weight", (V, C), "weight"))
    return out


def init_params(cfg, gen):
    """weights ~ N(0, 0.1^2); norm weights 1 + 0.1*N(0,1); biases 0.1*N(0,1). Drawn in order."""
    params = {}
    for name, shape, kind in param_shapes(cfg):
        z = torch.randn(shape, generator=gen, dtype=DT)
        params[name] = (1.0 + 0.1 * z) if kind == "norm" else 0.1 * z
    return params


# ---------------------------------------------------------------- the model, by hand

def layernorm(x, w, b, eps):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)  # biased
    y = (x - mean) / torch.sqrt(var + eps) * w
    return y + b if b is not None else y


def rmsnorm(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def silu(x):
    return x / (1.0 + torch.exp(-x))


def rope(x, theta):
    """x: (B, NH, T, HS). Rotate-half convention, t = 0-based position."""
    T, HS = x.shape[-2], x.shape[-1]
    half = HS // 2
    i = torch.arange(half, dtype=DT)
    f = theta ** (-2.0 * i / HS)                        # (HS/2,)
    ang = torch.arange(T, dtype=DT)[:, None] * f[None]  # (T, HS/2)
    cos, sin = torch.cos(ang), torch.sin(ang)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def linear(x, w, b):
    y = x @ w.t()
    return y + b if b is not None else y


def forward(cfg, P, tokens, targets, acts=None):
    B, T = tokens.shape
    C, NH = cfg["d_model"], cfg["n_heads"]
    HS = C // NH
    H = cfg["mlp_hidden"]
    eps = cfg["norm_eps"]

    def norm(x, prefix):
        if cfg["norm"] == "layernorm":
            return layernorm(x, P[prefix + ".weight"], P.get(prefix + ".bias"), eps)
        return rmsnorm(x, P[prefix + ".weight"], eps)

    tok = tokens.long()
    x = P["wte"][tok]
    if cfg["position"] == "learned":
        x = x + P["wpe"][:T][None]
    if acts is not None:
        acts["embed"] = x
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(cfg["n_layers"]):
        p = f"h.{l}."
        a = norm(x, p + "ln1")
        qkv = linear(a, P[p + "attn.qkv.weight"], P.get(p + "attn.qkv.bias"))  # (B,T,3C)
        q, k, v = qkv[..., :C], qkv[..., C:2 * C], qkv[..., 2 * C:]
        q = q.reshape(B, T, NH, HS).transpose(1, 2)  # (B,NH,T,HS)
        k = k.reshape(B, T, NH, HS).transpose(1, 2)
        v = v.reshape(B, T, NH, HS).transpose(1, 2)
        if cfg["position"] == "rope":
            q = rope(q, cfg["rope_theta"])
            k = rope(k, cfg["rope_theta"])
        s = (q @ k.transpose(-1, -2)) / math.sqrt(HS)
        s = s.masked_fill(~causal, float("-inf"))
        s = s - s.max(-1, keepdim=True).values
        e = torch.exp(s)
        att = e / e.sum(-1, keepdim=True)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + linear(y, P[p + "attn.proj.weight"], P.get(p + "attn.proj.bias"))
        if acts is not None:
            acts[p + "attn_out"] = x
        m = norm(x, p + "ln2")
        u = linear(m, P[p + "mlp.fc.weight"], P.get(p + "mlp.fc.bias"))
        if cfg["activation"] == "gelu":
            h = gelu_tanh(u)
        else:
            h = silu(u[..., :H]) * u[..., H:]
        x = x + linear(h, P[p + "mlp.proj.weight"], P.get(p + "mlp.proj.bias"))
        if acts is not None:
            acts[p + "out"] = x
    x = norm(x, "ln_f")
    if acts is not None:
        acts["ln_f"] = x
    wlm = P["wte"] if cfg["tie_embeddings"] else P["lm_head.weight"]
    logits = x @ wlm.t()
    # cross-entropy by hand: logsumexp - logit[target], mean over targets >= 0
    tgt = targets.long()
    valid = tgt >= 0
    mx = logits.max(-1, keepdim=True).values
    lse = (mx + torch.log(torch.exp(logits - mx).sum(-1, keepdim=True))).squeeze(-1)
    picked = logits.gather(-1, tgt.clamp(min=0)[..., None]).squeeze(-1)
    nll = (lse - picked)[valid]
    loss = nll.sum() / valid.sum()
    return logits, loss


def loss_and_grads(cfg, params, tokens, targets, acts=None):
    P = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
    logits, loss = forward(cfg, P, tokens, targets, acts)
    loss.backward()
    grads = {k: P[k].grad.detach().clone() for k in params}
    return logits.detach(), loss.detach(), grads


# ---------------------------------------------------------------- AdamW, by hand

def adamw_trajectory(cfg, params, tokens, targets):
    c = TRAJ
    p = {k: v.clone() for k, v in params.items()}
    m = {k: torch.zeros_like(v) for k, v in p.items()}
    v2 = {k: torch.zeros_like(v) for k, v in p.items()}
    losses, norms = [], []
    for t in range(1, c["steps"] + 1):
        _, loss, g = loss_and_grads(cfg, p, tokens, targets)
        losses.append(loss.item())
        norm = math.sqrt(sum(float((gi * gi).sum()) for gi in g.values()))
        norms.append(norm)
        scale = min(1.0, c["grad_clip"] / (norm + 1e-6))
        for k in p:
            gk = g[k] * scale
            m[k] = c["beta1"] * m[k] + (1 - c["beta1"]) * gk
            v2[k] = c["beta2"] * v2[k] + (1 - c["beta2"]) * gk * gk
            mhat = m[k] / (1 - c["beta1"] ** t)
            vhat = v2[k] / (1 - c["beta2"] ** t)
            p[k] = p[k] - c["lr"] * (mhat / (torch.sqrt(vhat) + c["eps"]) + c["weight_decay"] * p[k])
    return losses, norms, p


# ---------------------------------------------------------------- cross-checks

def rel(a, b):
    return float((a - b).norm() / max(float(b.norm()), 1e-300))


def check_against_builtins(cfg, params, tokens, targets, logits, loss, traj_losses, traj_params):
    x = torch.randn(5, 7, dtype=DT)
    w, b = torch.randn(7, dtype=DT), torch.randn(7, dtype=DT)
    assert rel(layernorm(x, w, b, 1e-5), F.layer_norm(x, (7,), w, b, 1e-5)) < 1e-12
    assert rel(gelu_tanh(x), F.gelu(x, approximate="tanh")) < 1e-12
    assert rel(silu(x), F.silu(x)) < 1e-12
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.long().reshape(-1),
                         ignore_index=-1)
    assert abs(float(ce) - float(loss)) < 1e-12, (float(ce), float(loss))
    # rope against the complex-number formulation (pairs (i, i+HS/2))
    q = torch.randn(2, 3, 5, 8, dtype=DT)
    f = 10000.0 ** (-torch.arange(4, dtype=DT) * 2 / 8)
    z = torch.complex(q[..., :4], q[..., 4:]) * torch.polar(torch.ones(5, 4, dtype=DT),
                                                           torch.arange(5, dtype=DT)[:, None] * f)
    assert rel(rope(q, 10000.0), torch.cat([z.real, z.imag], -1)) < 1e-12
    # hand AdamW + clipping against torch.optim.AdamW + clip_grad_norm_
    c = TRAJ
    P = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    opt = torch.optim.AdamW(list(P.values()), lr=c["lr"], betas=(c["beta1"], c["beta2"]),
                            eps=c["eps"], weight_decay=c["weight_decay"])
    for t in range(c["steps"]):
        opt.zero_grad()
        _, l = forward(cfg, P, tokens, targets)
        assert abs(l.item() - traj_losses[t]) < 1e-12
        l.backward()
        torch.nn.utils.clip_grad_norm_(list(P.values()), c["grad_clip"])
        opt.step()
    for k in P:
        assert rel(P[k].detach(), traj_params[k]) < 1e-10, k


# ---------------------------------------------------------------- writing

def put_attr_str(obj, key, s):
    """Fixed-length, NUL-terminated ASCII string attribute (easy to read from C)."""
    tid = h5py.h5t.C_S1.copy()
    tid.set_size(len(s) + 1)
    tid.set_strpad(h5py.h5t.STR_NULLTERM)
    obj.attrs.create(key, np.array(s.encode("ascii"), dtype=f"S{len(s) + 1}"), dtype=h5py.Datatype(tid))


def write_fixture(path, name, cfg, seed):
    gen = torch.Generator().manual_seed(seed)
    params = init_params(cfg, gen)
    B, T, V = cfg["batch"], cfg["seq_len"], cfg["vocab_size"]
    tokens = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    # targets: next token of the sequence (last one random), with a few ignored positions
    nxt = torch.randint(0, V, (B, 1), generator=gen, dtype=torch.int64)
    targets = torch.cat([tokens[:, 1:], nxt], dim=1)
    targets[0, 0] = -1
    targets[1, 3] = -1
    targets[1, 4] = -1
    targets[2, T - 1] = -1
    tokens, targets = tokens.to(torch.int32), targets.to(torch.int32)

    acts = {}
    logits, loss, grads = loss_and_grads(cfg, params, tokens, targets, acts)
    losses, norms, final = adamw_trajectory(cfg, params, tokens, targets)
    assert abs(losses[0] - float(loss)) < 1e-12
    check_against_builtins(cfg, params, tokens, targets, logits, loss, losses, final)

    with h5py.File(path, "w") as f:
        put_attr_str(f, "fixture", name)
        put_attr_str(f, "generator", f"scripts/make_fixtures.py (torch {torch.__version__}, seed {seed}, float64)")
        g = f.create_group("config")
        for k in ["vocab_size", "seq_len", "d_model", "n_layers", "n_heads", "mlp_hidden"]:
            g.attrs.create(k, np.int64(cfg[k]))
        for k in ["norm", "activation", "position"]:
            put_attr_str(g, k, cfg[k])
        for k in ["tie_embeddings", "bias"]:
            g.attrs.create(k, np.int64(1 if cfg[k] else 0))
        for k in ["rope_theta", "norm_eps"]:
            g.attrs.create(k, np.float64(cfg[k]))
        g.attrs.create("batch_size", np.int64(B))
        g = f.create_group("inputs")
        g.create_dataset("tokens", data=tokens.numpy().astype(np.int32))
        g.create_dataset("targets", data=targets.numpy().astype(np.int32))
        g = f.create_group("params")
        for k in params:
            g.create_dataset(k, data=params[k].numpy())
        g = f.create_group("outputs")
        g.create_dataset("logits", data=logits.numpy())
        g.create_dataset("loss", data=np.float64(loss.item()))
        g = f.create_group("grads")
        if cfg["bias"]:
            put_attr_str(g, "note", KBIAS_NOTE)
        for k in params:
            g.create_dataset(k, data=grads[k].numpy())
        g = f.create_group("activations")
        put_attr_str(g, "note", "optional debugging aids: residual stream (B,T,C) after each stage")
        for k, v in acts.items():
            g.create_dataset(k, data=v.detach().numpy())
        g = f.create_group("trajectory")
        for k in ["lr", "beta1", "beta2", "eps", "weight_decay", "grad_clip"]:
            g.attrs.create(k, np.float64(TRAJ[k]))
        g.attrs.create("steps", np.int64(TRAJ["steps"]))
        put_attr_str(g, "clip_formula", CLIP_FORMULA)
        put_attr_str(g, "adamw_formula", ADAMW_FORMULA)
        g.create_dataset("losses", data=np.array(losses, dtype=np.float64))
        g.create_dataset("grad_norms", data=np.array(norms, dtype=np.float64))
        gp = g.create_group("params")
        for k in final:
            gp.create_dataset(k, data=final[k].numpy())
    clipped = sum(n > TRAJ["grad_clip"] for n in norms)
    print(f"{path}: loss {float(loss):.6f}, {len(params)} params "
          f"({sum(p.numel() for p in params.values())} values), trajectory {['%.6f' % l for l in losses]}, "
          f"grad norms {['%.3f' % n for n in norms]} ({clipped}/{len(norms)} clipped), "
          f"{os.path.getsize(path)} bytes")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_fixtures.py OUT_DIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(SEED)
    for i, (name, cfg) in enumerate(CONFIGS.items()):
        write_fixture(os.path.join(out, name + ".h5"), name, cfg, SEED + i)


if __name__ == "__main__":
    main()
