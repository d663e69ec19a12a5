"""CUDA-event timing shared by the torch benchmark scripts (bench_lmhead.py, bench_cp_torch.py)."""
import torch


def event_times(fn, warmup, reps):
    """fn's GPU time per call in ms, one CUDA-event pair around each of reps calls after warmup
    calls (the device synchronized after each)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ms = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ms.append(a.elapsed_time(b))
    return ms
