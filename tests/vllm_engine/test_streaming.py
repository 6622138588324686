"""Streaming in real vLLM instances: the decode side reads a request slice by slice while its
prefill runs in 64-token chunks (pdplan's slices: the tokens each prefill step makes final,
and within a step the layers vLLM's ``save_kv_layer`` says are written), and decodes token
for token what one instance decodes; a decode-side prefix hit is not read. The oracle is vLLM
itself: one instance, no connector, the same prompts.

Run by scripts/test_vllm.sh (CI), which installs vLLM."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import pytest
from harness import (
    LENGTHS,
    MAX_TOKENS,
    STREAMED_LENGTHS,
    Instance,
    llm_args,
    pdplan_connector,
    prompts_of,
    streamed_params,
    streamed_prompts,
    write_model,
)
from test_vllm_connector import RECOMPUTED, assert_no_leak, closing  # noqa: F401

pytestmark = pytest.mark.vllm

#: Prefill chunks: a 333-token prompt runs in six steps.
CHUNK = 64
#: What a streamed request's one log line counts: slices read while its prefill still ran,
#: and layers read while their step still ran (its other layers not yet computed); at least
#: one of each.
EARLY = re.compile(r"streamed: .* [1-9][0-9]* slices read while its prefill runs")
AHEAD = re.compile(r"[1-9][0-9]* layer slices read while their step runs")
#: A request's one line on the decode side.
READ_LINE = re.compile(r"pdplan: request (\S+) read [0-9]+ blocks \([1-9][0-9]* bytes\)")


def streaming_pair(model: Path, logs: Path, name: str, port: int, prefix_caching: bool = False,
                   prefill_model: Path | None = None,
                   **extra: Any) -> tuple[Instance, Instance]:  # fmt: skip
    connector = pdplan_connector("kv_producer", port, **extra)
    prefill_args = llm_args(prefill_model or model, connector=connector)
    prefill_args["max_num_batched_tokens"] = CHUNK
    prefill = Instance(prefill_args, logs / f"{name}-prefill.log")
    decode_args = llm_args(model, connector=pdplan_connector("kv_consumer", port + 10))
    decode_args["enable_prefix_caching"] = prefix_caching
    try:
        decode = Instance(decode_args, logs / f"{name}-decode.log")
    except BaseException:
        prefill.close()
        raise
    return prefill, decode


def both(prefill: Instance, decode: Instance, prompts: list[list[int]],
         params: tuple[list[Any], list[Any]]) -> list[dict[str, Any]]:  # fmt: skip
    """Sends the prefill and the decode requests at once (a streaming proxy's way)."""
    prefilled: list[Any] = []
    thread = threading.Thread(target=lambda: prefilled.extend(prefill.generate(prompts, params[0])))
    thread.start()
    try:
        return decode.generate(prompts, params[1])
    finally:
        thread.join(timeout=300)


def test_a_streamed_request_decodes_what_one_instance_decodes(
    model: Path, logs: Path, reference: dict[tuple[int, ...], list[int]],
    closing: list[Instance],  # noqa: F811
) -> None:  # fmt: skip
    prefill, decode = streaming_pair(model, logs, "streamed", 6200)
    closing += [prefill, decode]
    prompts = streamed_prompts()[: len(STREAMED_LENGTHS)]
    # Layers saved while a step runs are read then when an ask falls inside the step (the
    # decode side asks every millisecond or so, a step runs several); on a loaded machine a
    # round's asks may all fall between steps, so up to three rounds, each decoding exactly.
    for round_ in range(3):
        params = streamed_params(prompts, 6200, MAX_TOKENS, f"s{round_}")
        decoded = both(prefill, decode, prompts, params)
        assert [d["tokens"] for d in decoded] == [reference[tuple(p)] for p in prompts]
        log = decode.tail(2000)
        assert RECOMPUTED not in log, log
        assert EARLY.search(log), "no slice was read while its prefill ran"
        # One line a request, however many slices it was read in.
        read = READ_LINE.findall(log)
        assert len(read) == len(set(read)) == len(prompts) * (round_ + 1), read
        if AHEAD.search(log):
            break
    assert AHEAD.search(log), "no layer was read while its step ran, in three rounds"
    assert_no_leak(prefill, decode)


def test_a_decode_side_prefix_hit_is_not_read(
    model: Path, logs: Path, reference: dict[tuple[int, ...], list[int]],
    closing: list[Instance],  # noqa: F811
) -> None:  # fmt: skip
    prefill, decode = streaming_pair(model, logs, "prefix", 6300, prefix_caching=True)
    closing += [prefill, decode]
    *_, hit, shared = streamed_prompts()
    # The decode side runs the shared prefix itself: its blocks are cached there.
    decode.generate([shared], [{"max_tokens": 1, "temperature": 0.0}])
    decoded = both(prefill, decode, [hit], streamed_params([hit], 6300, MAX_TOKENS, "hit"))
    assert decoded[0]["tokens"] == reference[tuple(hit)]
    log = decode.tail(2000)
    assert RECOMPUTED not in log, log
    assert "decode prefix 96" in log, "the prefix hit was not skipped"


def test_a_streamed_kv_from_other_weights_changes_what_decode_decodes(
    model: Path, logs: Path, reference: dict[tuple[int, ...], list[int]],
    closing: list[Instance], tmp_path: Path,  # noqa: F811
) -> None:  # fmt: skip
    """The control: the prefill side runs the same model with other random weights, so every
    streamed slice is another model's KV; decoding it must not give the reference tokens (the
    KV is read, not recomputed)."""
    # Named as the model is: the identity check compares names and shapes, not weights.
    other = write_model(tmp_path / "other-weights" / model.name, seed=1)
    prefill, decode = streaming_pair(model, logs, "control", 6400, prefill_model=other)
    closing += [prefill, decode]
    prompts = streamed_prompts()[: len(STREAMED_LENGTHS)]
    decoded = both(prefill, decode, prompts, streamed_params(prompts, 6400, MAX_TOKENS, "c"))
    differing = [d["tokens"] != reference[tuple(p)] for p, d in zip(prompts, decoded)]
    assert all(differing), differing
    log = decode.tail(2000)
    assert EARLY.search(log) and RECOMPUTED not in log, log


def test_decode_requests_aborted_while_they_stream_leak_no_block(
    model: Path, logs: Path, reference: dict[tuple[int, ...], list[int]],
    closing: list[Instance],  # noqa: F811
) -> None:  # fmt: skip
    """The decode side aborts two of three streamed requests a few steps in, while their
    prefill runs: their reads stop and their blocks are released once those in flight land,
    the third decodes as one instance does, and both sides end with every block free (the
    prefill side hears "done" or its 5 s lease ends)."""
    prefill, decode = streaming_pair(model, logs, "aborted", 6500, kv_lease_seconds=5)
    closing += [prefill, decode]
    prompts = streamed_prompts()[: len(STREAMED_LENGTHS)]
    first, then = streamed_params(prompts, 6500, MAX_TOKENS, "a")
    thread = threading.Thread(target=lambda: prefill.generate(prompts, first))
    thread.start()
    try:
        done = decode.call("generate_aborting", {
            "prompts": prompts, "params": then, "abort": [0, 2], "after_steps": 3,
        })  # fmt: skip
    finally:
        thread.join(timeout=300)
    assert sorted(done) == [1]
    assert done[1] == reference[tuple(prompts[1])]
    assert_no_leak(prefill, decode)


def test_a_windowed_hybrid_model_streams_what_one_instance_decodes(
    tmp_path: Path,
    logs: Path,
    closing: list[Instance],  # noqa: F811
) -> None:
    """A Llama whose even layers slide a 48-token window and odd layers attend fully (two KV
    cache groups, vLLM's hybrid allocator): streamed in 64-token chunks, the window group
    moves only the blocks the final length keeps, and decode decodes what one instance does.
    """
    model = write_model(tmp_path / "tiny-windowed", seed=4, window=48)
    prompts = prompts_of(STREAMED_LENGTHS + LENGTHS[:2], salt=17)
    greedy = {"max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True}
    one = Instance(llm_args(model), logs / "windowed-reference.log")
    closing.append(one)
    want = [o["tokens"] for o in one.generate(prompts, [greedy] * len(prompts))]
    one.close()
    prefill, decode = streaming_pair(model, logs, "windowed", 6260)
    closing += [prefill, decode]
    decoded = both(prefill, decode, prompts, streamed_params(prompts, 6260, MAX_TOKENS, "w"))
    assert [d["tokens"] for d in decoded] == want
    log = decode.tail(2000)
    assert RECOMPUTED not in log, log
    assert EARLY.search(log), "no slice was read while its prefill ran"


def test_a_model_with_state_streams_what_one_instance_decodes(
    tmp_path: Path,
    logs: Path,
    closing: list[Instance],  # noqa: F811
) -> None:
    """Nemotron-H (Mamba2 beside attention, its conv state dim-first): streamed in 64-token
    chunks, the prefill side leaves the prompt's last token to the decode side, whose slices
    end with the state at the prompt's end less that token; decode decodes what one instance
    does."""
    from families import FAMILIES

    family = FAMILIES["nemotron-h"]
    model = family.write(tmp_path / family.name, 0)
    env = dict(family.env)
    prompts = prompts_of((*STREAMED_LENGTHS, *LENGTHS[:2]), salt=9)
    greedy = {"max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True}
    one = Instance(llm_args(model), logs / "state-stream-reference.log", env)
    closing.append(one)
    want = [o["tokens"] for o in one.generate(prompts, [greedy] * len(prompts))]
    one.close()
    prefill_args = llm_args(model, connector=pdplan_connector("kv_producer", 6600))
    prefill_args["max_num_batched_tokens"] = CHUNK
    prefill = Instance(prefill_args, logs / "state-stream-prefill.log", env)
    closing.append(prefill)
    decode = Instance(llm_args(model, connector=pdplan_connector("kv_consumer", 6610)),
                      logs / "state-stream-decode.log", env)  # fmt: skip
    closing.append(decode)
    decoded = both(prefill, decode, prompts, streamed_params(prompts, 6600, MAX_TOKENS, "m"))
    assert [d["tokens"] for d in decoded] == want
    log = decode.tail(2000)
    assert RECOMPUTED not in log, log
    assert EARLY.search(log), "no slice was read while its prefill ran"
