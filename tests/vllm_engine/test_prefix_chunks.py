"""Settings deployments run, with real vLLM instances (0.32's CPU backend): prefix caching on
both sides (vLLM's default), a prefill side that runs 64-token chunks, a decode side whose
6-block cache makes it preempt, multi-turn conversations (each turn's prompt the last turn's
prompt and output and more: partial decode-side prefix hits, read only past them), and
aborts on either side at several moments. The oracle: the prefill instance alone (no
connector parameters) decoding the same prompts; and every block free on both sides after.

Run by scripts/test_vllm.sh (CI), which installs vLLM."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import (
    MAX_TOKENS,
    Instance,
    decode_params,
    llm_args,
    pdplan_connector,
    prefill_params,
    prompts_of,
)

pytestmark = pytest.mark.vllm

PORT = 6760
BLOCK_BYTES = 32 * 2 * 2 * 2 * 64 * 4  # tokens x layers x K,V x KV heads x dims x float32
#: The decode side's cache and longest request: 6 blocks of 32 tokens (and vLLM's null block).
DECODE_BLOCKS = 6
RECOMPUTED = "reported for the runtime to recompute"


@pytest.fixture(scope="module")
def pair(model: Path, logs: Path) -> Iterator[tuple[Instance, Instance]]:
    args = llm_args(model, connector=pdplan_connector("kv_producer", PORT, kv_lease_seconds=10))
    args.update(enable_prefix_caching=True, max_num_batched_tokens=64)
    prefill = Instance(args, logs / "chunks-prefill.log", serve=True)
    try:
        args = llm_args(model, connector=pdplan_connector("kv_consumer", PORT + 10))
        args.update(enable_prefix_caching=True, max_model_len=DECODE_BLOCKS * 32,
                    disable_log_stats=False,  # it counts preemptions and tokens loaded
                    kv_cache_memory_bytes=(DECODE_BLOCKS + 1) * BLOCK_BYTES)  # fmt: skip
        decode = Instance(args, logs / "chunks-decode.log")
    except BaseException:
        prefill.close()
        raise
    yield prefill, decode
    decode.close()
    prefill.close()


GREEDY = {"max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True}


def alone(prefill: Instance, prompts: list[list[int]]) -> list[list[int]]:
    """What the prefill instance decodes by itself (no connector parameters)."""
    return [o["tokens"] for o in prefill.generate(prompts, [GREEDY] * len(prompts))]


def assert_no_leak(prefill: Instance, decode: Instance) -> None:
    free = prefill.call("step_until", {"free": prefill.initial_free, "seconds": 60})
    assert free == prefill.initial_free, prefill.tail()
    assert decode.call("free_blocks") == decode.initial_free, decode.tail()


def test_multi_turn_conversations_decode_what_one_instance_decodes(
    pair: tuple[Instance, Instance],
) -> None:
    """Three conversations of three turns at once, each turn's prompt the last turn's prompt
    and output and 30 tokens more: the prefill side computes them in 64-token chunks past its
    prefix hit, the decode side reads only the blocks past its own hit (its 6 blocks hold
    fewer than the three together: it preempts and recomputes), and decodes what the prefill
    instance alone decodes."""
    prefill, decode = pair
    prompts = prompts_of((40, 47, 33), salt=51)
    partial = 0
    for turn in range(3):
        prefilled = prefill.generate(prompts, prefill_params(len(prompts)))
        before = decode.call("external_tokens")
        decoded = decode.generate(prompts, decode_params(prefilled, MAX_TOKENS))
        loaded = decode.call("external_tokens") - before
        outputs = [d["tokens"] for d in decoded]
        assert outputs == alone(prefill, prompts), turn
        # Read, not computed; past the first turn, only past the decode side's own hits
        # (where preemptions left the last turn's blocks cached).
        total = sum(len(p) for p in prompts)
        assert 0 < loaded <= total, (turn, loaded, total)
        partial += loaded < total
        more = prompts_of((30, 30, 30), salt=53 + turn)
        prompts = [p + o + m for p, o, m in zip(prompts, outputs, more)]
    assert partial  # a turn read past the decode side's own hit
    assert decode.call("preemptions") > 0
    assert RECOMPUTED not in decode.tail(400), decode.tail()
    assert_no_leak(prefill, decode)


@pytest.mark.parametrize("after_steps", [0, 1, 2, 4])
def test_aborts_on_either_side_leak_no_block(
    pair: tuple[Instance, Instance], after_steps: int
) -> None:
    """Requests aborted on the prefill side while its chunks run, and on the decode side
    ``after_steps`` steps after they arrive (before their blocks, while read, after): every
    other request decodes what one instance decodes, and both sides end with every block
    free."""
    prefill, decode = pair
    salt = 61 + after_steps
    long = prompts_of((300, 260), salt=salt)  # several chunks each
    ran = prefill.call("generate_aborting", {
        "prompts": long, "params": prefill_params(len(long)), "abort": [0],
        "after_steps": after_steps + 1,
    })  # fmt: skip
    assert sorted(ran) == [1]
    prompts = prompts_of((20, 45, 64, 97, 70), salt=salt)
    prefilled = prefill.generate(prompts, prefill_params(len(prompts)))
    aborted = [1, 3]
    done = decode.call("generate_aborting", {
        "prompts": prompts, "params": decode_params(prefilled, MAX_TOKENS),
        "abort": aborted, "after_steps": after_steps,
    })  # fmt: skip
    kept = [i for i in range(len(prompts)) if i not in aborted]
    assert sorted(done) == kept
    want = alone(prefill, [prompts[i] for i in kept])
    assert [done[i] for i in kept] == want
    assert_no_leak(prefill, decode)


def test_a_proxy_s_first_token_past_a_decode_side_hit(pair: tuple[Instance, Instance]) -> None:
    """A proxy hands the decode side the prompt and the first token, of prompts whose first
    blocks the decode side computed itself before: a hit of every token the prefill side
    holds reads nothing (the prefill side frees the blocks on its notice, not its lease), a
    hit of the first blocks reads only the blocks past it."""
    prefill, decode = pair
    hit = prompts_of((32, 64), salt=71)  # both fit the 6 blocks together
    longer = [p + q for p, q in zip(hit, prompts_of((20, 9), salt=73))]
    local = {**GREEDY, "max_tokens": 1}
    decode.generate(hit, [local] * len(hit))  # its blocks cached here
    for prompts, read in ((hit, 0), (longer, 20 + 9)):
        want = alone(prefill, prompts)
        lengthened = [[*p, w[0]] for p, w in zip(prompts, want)]
        since = len(prefill.log.read_text(errors="replace").splitlines())
        prefilled = prefill.generate(prompts, prefill_params(len(prompts)))
        before = decode.call("external_tokens")
        decoded = decode.generate(lengthened, decode_params(prefilled, MAX_TOKENS - 1))
        assert [d["tokens"] for d in decoded] == [w[1:] for w in want]
        assert decode.call("external_tokens") - before == read
        free = prefill.call("step_until", {"free": prefill.initial_free, "seconds": 5})
        assert free == prefill.initial_free  # freed on the notices, well before the lease
        log = prefill.log.read_text(errors="replace").splitlines()[since:]
        assert not [line for line in log if "within its lease" in line]
    assert RECOMPUTED not in decode.tail(400), decode.tail()
    assert_no_leak(prefill, decode)
