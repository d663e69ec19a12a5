#!/usr/bin/env python3
"""What PyTorch's scaled_dot_product_attention returns on rows that see no key (docs/conformance.md).

    python3 examples/sdpa_empty_rows.py            # on a GPU machine with torch

Spec §2.3: a row with no visible key has O = 0, LSE = -inf and zero gradients. This probe builds
one random problem (B=1, H=2, N=128, d=64) with an explicit boolean attn_mask in which rows 0..15
see no key, runs SDPA with its default backend choice and with each backend forced, and prints per
(dtype, backend): whether the backend ran, whether its O is bitwise the default's (which backend
the default picked), and what the empty rows hold: max |O| there, max |O - mean of V| there (the
answer of uniform attention over all keys), and whether any value is NaN. It compares nothing to
a tolerance and never fails: it reports.
"""
import sys
import warnings

try:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError:
    print("needs torch (with torch.nn.attention)")
    sys.exit(2)


def main():
    if not torch.cuda.is_available():
        print("needs a CUDA device")
        return 2
    dev = "cuda"
    warnings.filterwarnings("ignore", category=UserWarning)  # torch names each refused backend
    g = torch.Generator(device="cpu").manual_seed(7)
    B, H, N, d, n_empty = 1, 2, 128, 64, 16
    q0 = torch.randn(B, H, N, d, generator=g)
    k0 = torch.randn(B, H, N, d, generator=g)
    v0 = torch.randn(B, H, N, d, generator=g)
    mask = torch.ones(N, N, dtype=torch.bool).tril()  # causal, bottom-right = top-left at N_q = N_k
    mask[:n_empty, :] = False  # rows that see no key
    mask = mask.to(dev)
    backends = [("default", None), ("MATH", SDPBackend.MATH), ("EFFICIENT", SDPBackend.EFFICIENT_ATTENTION),
                ("FLASH", SDPBackend.FLASH_ATTENTION), ("CUDNN", SDPBackend.CUDNN_ATTENTION)]
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, cuDNN {torch.backends.cudnn.version()}")
    print(f"problem B={B} H={H} N={N} d={d}, boolean causal mask, rows 0..{n_empty - 1} see no key")
    print("| dtype | backend | ran | O bitwise = default | max abs O (empty rows) | "
          "max abs (O - mean V) (empty rows) | NaN (empty rows) | max abs dQ (empty rows) |")
    print("|---|---|---|---|---|---|---|---|")
    for dt_name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        q, k, v = (x.to(dev, dt) for x in (q0, k0, v0))
        mean_v = v.float().mean(dim=2, keepdim=True)[:, :, :1, :]
        ref = None
        for name, be in backends:
            qq = q.clone().requires_grad_(True)
            try:
                if be is None:
                    o = torch.nn.functional.scaled_dot_product_attention(qq, k, v, attn_mask=mask)
                else:
                    with sdpa_kernel([be]):
                        o = torch.nn.functional.scaled_dot_product_attention(qq, k, v, attn_mask=mask)
                o.float().sum().backward()
            except Exception as e:  # a backend that refuses this input
                msg = str(e).splitlines()[0][:60] if str(e) else type(e).__name__
                print(f"| {dt_name} | {name} | no: {msg} | | | | | |")
                continue
            oe = o[:, :, :n_empty, :].float()
            same = "-" if ref is None else ("yes" if torch.equal(o, ref) else "no")
            if ref is None:
                ref = o.detach().clone()
            print(f"| {dt_name} | {name} | yes | {same} | {oe.abs().max().item():.4g} | "
                  f"{(oe - mean_v).abs().max().item():.4g} | {bool(torch.isnan(oe).any().item())} | "
                  f"{qq.grad[:, :, :n_empty, :].float().abs().max().item():.4g} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
