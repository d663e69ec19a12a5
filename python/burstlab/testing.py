"""burstlab.testing: the torch.testing.assert_close habit for attention outputs."""
from . import check

__all__ = ["assert_attention_close"]


def assert_attention_close(q, k, v, *, out=None, lse=None, dq=None, dk=None, dv=None, do=None, mask=None, scale=None,
                           layout="BHSD", dtype=None, lse_empty="-inf", lse_base="e", max_list=5, name=None, msg=None,
                           check_rows=None, seed=0, q_positions=None, k_positions=None):
    """Raises AssertionError with the `burstlab check` table (per tensor max_abs, max_rel,
    err/bound, #wrong and the first mismatches with their (b, h, i, k) coordinates) unless every
    given tensor is within the spec §9 bound for the candidate's precision. Arguments as
    burstlab.check (layout "BHSD" (B, H, N, d) by default); msg is put before the table.
    check_rows=K checks K sampled query rows and key columns (spec §9.11), for problems the full
    oracle cannot hold; q_positions / k_positions: a shard's global rows (see burstlab.check).
    Returns the CheckResult when it passes."""
    r = check(q, k, v, out=out, lse=lse, dq=dq, dk=dk, dv=dv, do=do, mask=mask, scale=scale, layout=layout,
              dtype=dtype, lse_empty=lse_empty, lse_base=lse_base, max_list=max_list, name=name, check_rows=check_rows, seed=seed,
              q_positions=q_positions, k_positions=k_positions)
    if not r.passed:
        raise AssertionError(f"{msg}\n{r}" if msg else str(r))
    return r
