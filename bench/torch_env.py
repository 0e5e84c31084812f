"""What the PyTorch peers in bench/ share before torch is imported."""


def openblas_coretype():
    """The OpenBLAS kernel set this CPU deserves, from /proc/cpuinfo flags (None: leave it).

    Debian 12's OpenBLAS 0.3.21 (DYNAMIC_ARCH), which torch uses for fp32 GEMM, does not know
    newer Xeons (e.g. family 6 model 207, Emerald Rapids) and falls back to its generic
    "Prescott" SSE3 kernels: 3-4x slower GEMMs. OPENBLAS_CORETYPE fixes the choice; it is read
    when the library loads, so it too must be in the environment before torch is imported.
    """
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((l.split(":", 1)[1].split() for l in f if l.startswith("flags")), [])
    except OSError:
        return None
    if {"avx512f", "avx512bw", "avx512vl", "avx512_bf16"} <= set(flags):
        return "Cooperlake"
    if {"avx512f", "avx512bw", "avx512vl"} <= set(flags):
        return "SkylakeX"
    if {"avx2", "fma"} <= set(flags):
        return "Haswell"
    return None
