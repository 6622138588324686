"""Serving as deployments run it, with real vLLM instances (0.32's CPU backend) and faults
injected into real processes: a proxy that hands the decode side the prompt and the first
token (with and without a decode-side prefix hit), a queue longer than the lease, a read after
the lease ran out while other prompts took the prefill side's blocks, a side channel that drops
replies, a prefill instance stopped (SIGSTOP) past the transfer timeout then resumed, and one
killed mid-read then started again. Each asserts the tokens one instance decodes, no block
leaked on either side, and the one log line a failed request writes, with its cause.

One prefill and one decode instance serve every test in order (the killed prefill instance is
started again for the last); the decode side reaches the prefill side's side channel through
a relay that can drop its replies. The model is the tiny Llama with a 48-token sliding window
on every other layer: two KV cache groups, whose failed requests vLLM takes only whole (never
as block ids), and a prefill side that leaves the last prompt token to the decode side. The
oracle: the prefill instance alone (no connector parameters) decoding each prompt, before
any test. Run by scripts/test_vllm.sh (CI), which installs vLLM."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from harness import (
    FAULT_PROMPTS,
    MAX_TOKENS,
    Instance,
    decode_params,
    llm_args,
    pdplan_connector,
    prefill_params,
    prompts_of,
    proxied_prompts,
    write_model,
)
from relay import Relay

pytestmark = pytest.mark.vllm

PORT = 6700
ENGINE_ID = "fault-prefill"
#: The prefill side's lease, and the decode side's transfer and handshake timeouts.
LEASE_SECONDS = 2
TRANSFER_TIMEOUT = 4
#: The prefill side's cache: 48 blocks of 32 tokens (other prompts soon take freed ones).
PREFILL_BLOCKS = 48
BLOCK_BYTES = 32 * 2 * 2 * 2 * 64 * 4  # tokens x layers x K,V x KV heads x dims x float32
#: What a request the decode side could not read logs, and its cause for each fault.
RECOMPUTED = "reported for the runtime to recompute"


@dataclass
class Pair:
    prefill: Instance
    decode: Instance
    relay: Relay
    logs: Path
    model: Path
    #: Each prompt's tokens as the prefill instance alone decodes them.
    want: dict[tuple[int, ...], list[int]]

    def start_prefill(self, name: str) -> None:
        connector = pdplan_connector("kv_producer", PORT, kv_lease_seconds=LEASE_SECONDS)
        connector["engine_id"] = ENGINE_ID  # the same instance when started again
        args = llm_args(self.model, connector=connector)
        args.update(enable_prefix_caching=True, kv_cache_memory_bytes=PREFILL_BLOCKS * BLOCK_BYTES)
        self.prefill = Instance(args, self.logs / f"faults-{name}.log", serve=True)

    def prefilled(self, prompts: list[list[int]]) -> list[dict[str, Any]]:
        """The prefill side's params for ``prompts``, pointing the decode side at the relay."""
        out = self.prefill.generate(prompts, prefill_params(len(prompts)))
        for one in out:
            assert one["kv_transfer_params"]["do_remote_prefill"], one
            one["kv_transfer_params"]["remote_port"] = self.relay.port
        return out


GREEDY = {"max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, logs: Path) -> Iterator[Pair]:
    model = write_model(tmp_path_factory.mktemp("faults") / "tiny-llama-windowed", window=48)
    relay = Relay(PORT)
    made = Pair(None, None, relay, logs, model, {})  # type: ignore[arg-type]
    made.start_prefill("prefill")
    try:
        prompts = [p for batch in FAULT_PROMPTS.values() for p in batch] + proxied_prompts()
        outputs = made.prefill.generate(prompts, [GREEDY] * len(prompts))
        made.want = {tuple(p): o["tokens"] for p, o in zip(prompts, outputs)}
        connector = pdplan_connector("kv_consumer", PORT + 10,
                                     transfer_timeout_seconds=TRANSFER_TIMEOUT,
                                     handshake_timeout_seconds=2)  # fmt: skip
        args = llm_args(model, connector=connector)
        # It counts the prompt tokens it loads (vLLM's num_cached_tokens of a request read from
        # a prefill side is the prefill side's hit).
        args.update(enable_prefix_caching=True, max_num_seqs=2, disable_log_stats=False)
        made.decode = Instance(args, logs / "faults-decode.log", serve=True)
    except BaseException:
        made.prefill.close()
        relay.close()
        raise
    yield made
    made.decode.close()
    made.prefill.close()
    relay.close()


def log_lines(instance: Instance, text: str, since: int) -> list[str]:
    """The log's lines after line ``since`` that hold ``text``."""
    lines = instance.log.read_text(errors="replace").splitlines()[since:]
    return [line for line in lines if text in line]


def log_length(instance: Instance) -> int:
    return len(instance.log.read_text(errors="replace").splitlines())


def assert_no_leak(pair: Pair) -> None:
    free = pair.prefill.call("step_until", {"free": pair.prefill.initial_free, "seconds": 60})
    assert free == pair.prefill.initial_free, pair.prefill.tail()
    assert pair.decode.call("free_blocks") == pair.decode.initial_free, pair.decode.tail()


def greedy(prompts: list[list[int]], prefilled: list[dict[str, Any]],
           max_tokens: int = MAX_TOKENS) -> list[dict[str, Any]]:  # fmt: skip
    return decode_params(prefilled, max_tokens)


def test_a_proxy_that_adds_the_first_token_decodes_what_one_instance_decodes(
    pair: Pair,
) -> None:
    """The decode side gets the prompt and the prefill side's first token (as proxies that
    stream it do): its blocks past the prefill side's are computed, never paired with the
    prefill side's last block, with prompts of whole blocks (64, 96, 128 tokens) and prompts
    sharing two blocks with one read before (the window group never held their first blocks
    here: no decode-side hit; ``test_prefix_chunks`` reads past hits)."""
    since = (log_length(pair.prefill), log_length(pair.decode))
    for prompts in (FAULT_PROMPTS["proxy"], proxied_prompts()):
        prefilled = pair.prefilled(prompts)
        firsts = [pair.want[tuple(p)][0] for p in prompts]
        lengthened = [[*p, t] for p, t in zip(prompts, firsts)]
        before = pair.decode.call("external_tokens")
        decoded = pair.decode.generate(lengthened, greedy(prompts, prefilled, MAX_TOKENS - 1))
        assert [d["tokens"] for d in decoded] == [pair.want[tuple(p)][1:] for p in prompts]
        # The prefill side holds all but the last prompt token (the window's backoff): all
        # read, the rest computed.
        loaded = pair.decode.call("external_tokens") - before
        assert loaded == sum(len(p) - 1 for p in prompts)
    assert not log_lines(pair.decode, RECOMPUTED, since[1]), pair.decode.tail()
    assert_no_leak(pair)
    assert not log_lines(pair.prefill, "within its lease", since[0]), pair.prefill.tail()


def test_a_queue_longer_than_the_lease_renews_it(
    pair: Pair,
) -> None:
    """Requests that wait behind ten long local ones (the decode side runs two at a time)
    for many times the prefill side's lease: the decode side's holds renew it, and they are
    read, not recomputed; the prefill side frees no lease unread."""
    prompts = FAULT_PROMPTS["queued"]
    prefilled = pair.prefilled(prompts)
    since = (log_length(pair.prefill), log_length(pair.decode))
    started = time.monotonic()
    fillers = prompts_of(tuple(range(8, 18)), salt=41)
    done = pair.decode.call("generate_behind", {
        "fillers": fillers, "filler_tokens": 480, "prompts": prompts,
        "params": greedy(prompts, prefilled),
    })  # fmt: skip
    waited = time.monotonic() - started
    assert waited > 2 * LEASE_SECONDS, waited  # the queue outlasted the lease
    assert [done[i] for i in range(len(prompts))] == [pair.want[tuple(p)] for p in prompts]
    assert not log_lines(pair.decode, RECOMPUTED, since[1]), pair.decode.tail()
    assert not log_lines(pair.prefill, "within its lease", since[0]), pair.prefill.tail()
    assert_no_leak(pair)


def test_a_read_after_the_lease_ran_out_is_recomputed(
    pair: Pair,
) -> None:
    """The decode side gets the requests only after their lease ran out and other prompts
    took the prefill side's blocks (a proxy that waited): it reads nothing it cannot prove
    held, recomputes each request, and says why, once a request."""
    prompts = FAULT_PROMPTS["expired"]
    prefilled = pair.prefilled(prompts)
    since = (log_length(pair.prefill), log_length(pair.decode))
    assert_no_leak(pair)  # the prefill side freed them at the lease's end
    assert len(log_lines(pair.prefill, "within its lease", since[0])) == len(prompts)
    others = prompts_of((300, 310, 320, 330, 340), salt=43)
    pair.prefill.generate(others, [{"max_tokens": 1, "temperature": 0.0}] * len(others))
    decoded = pair.decode.generate(prompts, greedy(prompts, prefilled))
    assert [d["tokens"] for d in decoded] == [pair.want[tuple(p)] for p in prompts]
    causes = log_lines(pair.decode, RECOMPUTED, since[1])
    assert len(causes) == len(prompts) and all("(lease)" in c for c in causes), causes
    assert_no_leak(pair)


def read_first(pair: Pair, name: str) -> None:
    """A request read as usual, so the fault strikes a connected peer mid-read."""
    prompts = FAULT_PROMPTS[name]
    since = log_length(pair.decode)
    decoded = pair.decode.generate(prompts, greedy(prompts, pair.prefilled(prompts)))
    assert [d["tokens"] for d in decoded] == [pair.want[tuple(p)] for p in prompts]
    assert not log_lines(pair.decode, RECOMPUTED, since), pair.decode.tail()


def assert_failed_mid_read(pair: Pair, count: int, since: int) -> None:
    """Each request logged once, its cause a read's (not a handshake's)."""
    causes = log_lines(pair.decode, RECOMPUTED, since)
    assert len(causes) == count, causes
    assert all("(lease)" in c or "(transfer)" in c for c in causes), causes


def decoding(pair: Pair, prompts: list[list[int]],
             prefilled: list[dict[str, Any]]) -> Future[list[dict[str, Any]]]:  # fmt: skip
    """The decode side's generate, run while the test acts on the prefill process."""
    return ThreadPoolExecutor(1).submit(pair.decode.generate, prompts,
                                        greedy(prompts, prefilled))  # fmt: skip


def test_a_side_channel_that_drops_replies_is_recomputed(
    pair: Pair,
) -> None:
    """Every reply of the prefill side's side channel lost: no read is confirmed held, so
    each request is recomputed once its transfer timeout passes, saying so; the prefill side
    frees them (the decode side's "done" still arrives, or the lease ends)."""
    prompts = FAULT_PROMPTS["dropped"]
    prefilled = pair.prefilled(prompts)
    since = log_length(pair.decode)
    pair.relay.drop_replies = True
    try:
        decoded = pair.decode.generate(prompts, greedy(prompts, prefilled))
    finally:
        pair.relay.drop_replies = False
    assert [d["tokens"] for d in decoded] == [pair.want[tuple(p)] for p in prompts]
    causes = log_lines(pair.decode, RECOMPUTED, since)
    assert len(causes) == len(prompts) and all("(lease)" in c for c in causes), causes
    assert_no_leak(pair)


def test_a_prefill_stopped_past_the_timeout_then_resumed(
    pair: Pair,
) -> None:
    """The prefill process stopped (SIGSTOP) while the decode side reads, for longer than
    the transfer timeout, then resumed: the requests are recomputed with their cause, and
    the prefill side frees their blocks once it runs again."""
    read_first(pair, "warm-stopped")
    prompts = FAULT_PROMPTS["stopped"]
    prefilled = pair.prefilled(prompts)
    since = log_length(pair.decode)
    os.kill(pair.prefill.process.pid, signal.SIGSTOP)
    try:
        running = decoding(pair, prompts, prefilled)
        time.sleep(TRANSFER_TIMEOUT + 2)
    finally:
        os.kill(pair.prefill.process.pid, signal.SIGCONT)
    decoded = running.result(timeout=120)
    assert [d["tokens"] for d in decoded] == [pair.want[tuple(p)] for p in prompts]
    assert_failed_mid_read(pair, len(prompts), since)
    assert_no_leak(pair)


def test_a_prefill_killed_mid_read_is_recomputed_and_met_anew_when_back(
    pair: Pair,
) -> None:
    """The prefill process killed while the decode side reads (stopped first, so the reads
    are in flight when it dies): the requests are recomputed with their cause and the decode
    side leaks no block. The instance started again on the same port and engine id is met
    anew: its requests are read."""
    read_first(pair, "warm-killed")
    prompts = FAULT_PROMPTS["killed"]
    prefilled = pair.prefilled(prompts)
    since = log_length(pair.decode)
    os.kill(pair.prefill.process.pid, signal.SIGSTOP)
    running = decoding(pair, prompts, prefilled)
    time.sleep(1)
    pair.prefill.kill()
    decoded = running.result(timeout=120)
    assert [d["tokens"] for d in decoded] == [pair.want[tuple(p)] for p in prompts]
    assert_failed_mid_read(pair, len(prompts), since)
    assert pair.decode.call("free_blocks") == pair.decode.initial_free
    pair.prefill.close()
    pair.start_prefill("prefill-again")
    again = FAULT_PROMPTS["again"]
    since = log_length(pair.decode)
    decoded = pair.decode.generate(again, greedy(again, pair.prefilled(again)))
    assert [d["tokens"] for d in decoded] == [pair.want[tuple(p)] for p in again]
    assert not log_lines(pair.decode, RECOMPUTED, since), pair.decode.tail()
    assert_no_leak(pair)
