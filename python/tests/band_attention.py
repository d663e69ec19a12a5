"""Exact fp64 attention for a causal sliding window (keys i - w .. i), in NumPy, one block of rows
at a time: O(N w d) time and O(block (block + w)) memory, so the tests can build a correct
candidate at N = 200000 where neither a dense N x N attention nor the full oracle fits."""
import numpy as np


def band_attention(q, k, v, do, w, block=128):
    """q, k, v, do (B, H, N, d) fp64, one kv-head per q-head; returns O, LSE, dQ, dK, dV."""
    B, H, N, d = q.shape
    s = 1.0 / np.sqrt(d)
    O = np.zeros_like(q)
    L = np.zeros((B, H, N))
    dQ = np.zeros_like(q)
    dK = np.zeros_like(k)
    dV = np.zeros_like(v)
    for a in range(0, N, block):
        z = min(N, a + block)
        lo = max(0, a - w)
        i = np.arange(a, z)[:, None]
        j = np.arange(lo, z)[None, :]
        vis = (j <= i) & (j >= i - w)
        S = np.einsum("bhik,bhjk->bhij", q[:, :, a:z], k[:, :, lo:z]) * s
        S = np.where(vis, S, -np.inf)
        m = S.max(-1, keepdims=True)
        P = np.exp(S - m)
        l = P.sum(-1, keepdims=True)
        L[:, :, a:z] = (m + np.log(l))[..., 0]
        P /= l
        O[:, :, a:z] = P @ v[:, :, lo:z]
        dP = do[:, :, a:z] @ np.swapaxes(v[:, :, lo:z], -1, -2)
        D = (do[:, :, a:z] * O[:, :, a:z]).sum(-1, keepdims=True)
        dS = P * (dP - D)
        dQ[:, :, a:z] = s * (dS @ k[:, :, lo:z])
        dK[:, :, lo:z] += s * (np.swapaxes(dS, -1, -2) @ q[:, :, a:z])
        dV[:, :, lo:z] += np.swapaxes(P, -1, -2) @ do[:, :, a:z]
    return O, L, dQ, dK, dV
