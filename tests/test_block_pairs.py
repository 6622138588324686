"""Which blocks a KV cache group moves and how the two sides' blocks pair, against the block
tables vLLM's hybrid allocator writes, simulated position by position: a block list holds a
block a ``block_size`` tokens of the request, a window group the null block (0) where every
token of a block left the window (``SlidingWindowManager.remove_skipped_blocks``), the decode
side's blocks to fill those past its prefix hit. The oracle is the token position: a decode
block must receive the prefill block that holds the same tokens."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from pdplan import UnsupportedPDLayoutError
from pdplan.session._block_pairs import kept_blocks, paired_blocks, paired_slots

NULL = 0


def table(ids: list[int], tokens: int, block: int, window: int | None) -> list[int]:
    """A group's block list for a request whose ``tokens`` are computed: a block a position,
    null where a window has dropped every token of it (tokens before ``tokens - window + 1``,
    the window of the next token)."""
    positions = -(-tokens // block)
    first = 0 if window is None else max(0, (tokens - window + 1) // block)
    return [NULL if p < first else ids[p] for p in range(positions)]


@given(
    tokens=st.integers(1, 400),
    block=st.sampled_from([8, 16, 32]),
    window=st.none() | st.integers(1, 160),
    hit_blocks=st.integers(0, 10),
    seed=st.integers(0, 2**16),
)
def test_decode_blocks_pair_with_the_prefill_blocks_of_the_same_tokens(
    tokens: int, block: int, window: int | None, hit_blocks: int, seed: int
) -> None:
    import random

    positions = -(-tokens // block)
    rng = random.Random(seed)
    prefill_ids = rng.sample(range(1, 10_000), positions)
    decode_ids = rng.sample(range(1, 10_000), positions)
    kind = "attention" if window is None else "window"
    prefill = table(prefill_ids, tokens, block, window)
    decode = table(decode_ids, tokens, block, window)
    # The decode side fills its live blocks past its prefix hit (vLLM's unhashed blocks).
    hit = min(hit_blocks, positions)
    to_fill = [b for p, b in enumerate(decode) if b != NULL and p >= hit]
    local, remote = paired_blocks(
        kept_blocks(to_fill, kind, NULL), kept_blocks(prefill, kind, NULL), group=0
    )
    assert local == tuple(to_fill)
    for mine, theirs in zip(local, remote):
        assert theirs == prefill_ids[decode_ids.index(mine)]  # the same tokens' block


def test_the_head_of_a_window_s_list_is_never_read() -> None:
    """The sliding-window failure the decode side had: its three blocks paired with the head of
    the prefill list, the null block first."""
    prefill = [NULL, 12, 13, 14]  # 97 tokens, 32-token blocks, a 48-token window
    local, remote = paired_blocks((11, 12, 13), kept_blocks(prefill, "window", NULL), 0)
    assert remote == (12, 13, 14) and local == (11, 12, 13)


def test_a_state_group_moves_its_running_state_only() -> None:
    # Superseded states before it (null or not), speculative scratch slots after it.
    assert kept_blocks([NULL, NULL, 7], "state", NULL) == (7,)
    assert kept_blocks([5, 9, 3, 4], "state", NULL, scratch_blocks=2) == (9,)
    assert kept_blocks([9], "state", NULL, scratch_blocks=3) == (9,)
    assert kept_blocks([], "state", NULL) == ()


def test_a_null_block_where_bytes_are_kept_is_refused() -> None:
    with pytest.raises(UnsupportedPDLayoutError, match="hold the null block 0"):
        kept_blocks([3, NULL, 4], "attention", NULL)
    with pytest.raises(UnsupportedPDLayoutError, match="hold the null block 0"):
        kept_blocks([NULL, 3, NULL], "window", NULL)
    with pytest.raises(UnsupportedPDLayoutError, match="hold the null block 0"):
        kept_blocks([3, NULL], "state", NULL)


def test_a_decode_side_needing_blocks_the_prefill_side_freed_is_refused() -> None:
    with pytest.raises(UnsupportedPDLayoutError, match="group 2: the decode side holds 3"):
        paired_blocks((1, 2, 3), (7, 8), group=2)


@example(tokens=16, remote_block=16, local_block=16, window=1, hit=0, early=0, seed=0)
@given(
    tokens=st.integers(1, 400),
    remote_block=st.sampled_from([16, 32, 128]),
    local_block=st.sampled_from([16, 32, 128]),
    window=st.none() | st.integers(1, 300),
    hit=st.integers(0, 400),
    early=st.integers(0, 64),
    seed=st.integers(0, 2**16),
)
def test_blocks_of_other_sizes_pair_each_token_with_the_same_token_s_slot(
    tokens: int, remote_block: int, local_block: int, window: int | None, hit: int, early: int,
    seed: int,
) -> None:  # fmt: skip
    """Two sides whose blocks hold other token counts: every token the decode side needs moves
    from the prefill slot holding it to the decode slot for it, read off both sides' simulated
    block tables position by position; a token the prefill side's window dropped is refused."""
    import random

    rng = random.Random(seed)
    remote_ids = rng.sample(range(1, 10_000), -(-tokens // remote_block))
    local_ids = rng.sample(range(1, 10_000), -(-tokens // local_block))
    prefill = table(remote_ids, tokens, remote_block, window)
    kind = "attention" if window is None else "window"
    # The decode side fills its blocks past its prefix hit; it needs the tokens its window
    # keeps for the next token (or, ``early``, some the prefill side's window dropped).
    first = min(hit, tokens - 1) // local_block * local_block
    kept_from = 0 if window is None else max(0, tokens + 1 - window)
    needed = max(first, kept_from - early)
    local = local_ids[first // local_block :]
    # A window of fewer tokens than the last block's may have dropped every block.
    held_from = next((p for p, b in enumerate(prefill) if b != NULL), len(prefill)) * remote_block
    if needed < held_from:
        with pytest.raises(UnsupportedPDLayoutError, match="freed bytes the decode side needs"):
            paired_slots(local, (first, needed), local_block,
                         kept_blocks(prefill, kind, NULL), remote_block, tokens, 0)  # fmt: skip
        return
    remote_slots, local_slots = paired_slots(local, (first, needed), local_block,
                                             kept_blocks(prefill, kind, NULL), remote_block,
                                             tokens, 0)  # fmt: skip
    for t in range(tokens):
        moves = t >= needed
        want_remote = prefill[t // remote_block] * remote_block + t % remote_block
        want_local = local_ids[t // local_block] * local_block + t % local_block
        assert remote_slots[t] == (want_remote if moves else -1), t
        assert local_slots[t] == (want_local if moves else -1), t
