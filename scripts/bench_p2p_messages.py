"""scripts/bench_p2p_messages.py: what splitting a tensor into many point-to-point messages costs
over NCCL (torch.distributed's P2P ops on 2 GPUs; run under torchrun --nproc-per-node 2).

The shape is the all-to-all of burstlab's collectives at 32K tokens, 32 heads, d = 128, bf16 on
2 ranks: per tensor each rank sends its peer 64 MiB, as 16 messages of 4 MiB (one per (b, h),
16 heads) or as one. Rows: messages per tensor, tensors, whether all tensors go in one group (one
batch_isend_irecv) or one group each; the median of 30 timed repeats after 5 warm-ups, and the
bandwidth one way. Usage:

    NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc-per-node 2 scripts/bench_p2p_messages.py
"""
import time

import torch
import torch.distributed as dist

MiB = 1 << 20
# (messages per tensor, tensors, all tensors in one group)
CASES = [(16, 3, False), (1, 3, False), (16, 3, True), (1, 3, True), (16, 1, False), (1, 1, False), (4, 3, False)]


def bufs(n, size, dev):
    """n bf16 buffers of `size` bytes each."""
    return [torch.empty(size // 2, dtype=torch.bfloat16, device=dev) for _ in range(n)]


def run(pieces, size, tensors, one_group, peer, dev):
    """Median ms of exchanging `tensors` tensors of `size` bytes with peer, each as `pieces` messages."""
    s = [bufs(pieces, size // pieces, dev) for _ in range(tensors)]
    d = [bufs(pieces, size // pieces, dev) for _ in range(tensors)]

    def once():
        ops_all = []
        for t in range(tensors):
            ops = []
            for i in range(pieces):
                ops.append(dist.P2POp(dist.irecv, d[t][i], peer))
                ops.append(dist.P2POp(dist.isend, s[t][i], peer))
            if one_group:
                ops_all += ops
            else:  # one group per tensor, each waited before the next is posted
                for q in dist.batch_isend_irecv(ops):
                    q.wait()
        if one_group:
            for q in dist.batch_isend_irecv(ops_all):
                q.wait()
        torch.cuda.synchronize()

    for _ in range(5):
        once()
    ts = []
    for _ in range(30):
        dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        once()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2] * 1e3


def main():
    dist.init_process_group("nccl")
    r = dist.get_rank()
    peer = 1 - r
    torch.cuda.set_device(r)
    dev = torch.device("cuda", r)
    rows = []
    for pieces, tensors, one in CASES:
        ms = run(pieces, 64 * MiB, tensors, one, peer, dev)
        rows.append((pieces, tensors, one, ms, tensors * 64 * MiB / ms / 1e6))
    if r == 0:
        print(torch.cuda.get_device_name(0), "torch", torch.__version__, "nccl", torch.cuda.nccl.version())
        print("messages/tensor tensors one_group  median_ms  GB/s(one direction)")
        for p, t, o, ms, gbs in rows:
            print(f"{p:16d} {t:7d} {str(o):9s} {ms:10.3f} {gbs:8.1f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
