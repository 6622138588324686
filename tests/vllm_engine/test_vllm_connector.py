"""PdplanConnector inside real vLLM instances (vLLM 0.32's CPU backend): a prefill and a decode
process decode token for token what one instance decodes, for TP 1 -> 2, 2 -> 1 and 2 -> 2
through NIXL and a pair through Mooncake; a corrupted prefill KV changes the output (the KV is
used, not recomputed); a mix of finished, aborted and never-read requests leaks no block on
either side; a prefill killed after its forward pass is recomputed by the decode side, which
says so. The oracle is vLLM itself: one instance, no connector, the same prompts.

Run by scripts/test_vllm.sh (CI), which installs vLLM."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import (
    LENGTHS,
    MAX_TOKENS,
    Instance,
    decode_params,
    llm_args,
    pdplan_connector,
    prefill_params,
    prompts_of,
    write_model,
)

pytestmark = pytest.mark.vllm

_ports = itertools.count(5800, 20)
#: What the connector logs when it hands blocks back to vLLM to recompute.
RECOMPUTED = "reported for the runtime to recompute"


def pair(model: Path, logs: Path, name: str, prefill_tp: int, decode_tp: int,
         engine: str = "nixl", **extra: Any) -> tuple[Instance, Instance]:  # fmt: skip
    port = next(_ports)
    prefill = Instance(
        llm_args(model, tp=prefill_tp,
                 connector=pdplan_connector("kv_producer", port, engine, **extra)),
        logs / f"{name}-prefill.log",
    )  # fmt: skip
    try:
        decode = Instance(
            llm_args(model, tp=decode_tp,
                     connector=pdplan_connector("kv_consumer", port + 10, engine)),
            logs / f"{name}-decode.log",
        )  # fmt: skip
    except BaseException:
        prefill.close()
        raise
    return prefill, decode


@pytest.fixture
def closing() -> Iterator[list[Instance]]:
    instances: list[Instance] = []
    yield instances
    for instance in instances:
        instance.close()


def assert_no_leak(prefill: Instance, decode: Instance) -> None:
    # The prefill frees a request's blocks when its engine steps after the decode side's
    # notice (or the lease); step it until then.
    freed = prefill.call("step_until", {"free": prefill.initial_free, "seconds": 60})
    assert freed == prefill.initial_free, (freed, prefill.initial_free, prefill.tail())
    assert decode.call("free_blocks") == decode.initial_free


@pytest.mark.parametrize(
    ("engine", "prefill_tp", "decode_tp"),
    [("nixl", 1, 2), ("nixl", 2, 1), ("nixl", 2, 2), ("mooncake", 1, 1)],
)
def test_two_instances_decode_what_one_decodes(
    model: Path, logs: Path, reference: dict[tuple[int, ...], list[int]],
    closing: list[Instance], engine: str, prefill_tp: int, decode_tp: int,
) -> None:  # fmt: skip
    name = f"{engine}-{prefill_tp}-{decode_tp}"
    prefill, decode = pair(model, logs, name, prefill_tp, decode_tp, engine)
    closing += [prefill, decode]
    prompts = prompts_of(LENGTHS)
    prefilled = prefill.generate(prompts, prefill_params(len(prompts)))
    assert all(p["kv_transfer_params"]["do_remote_prefill"] for p in prefilled)
    decoded = decode.generate(prompts, decode_params(prefilled, MAX_TOKENS))
    assert [d["tokens"] for d in decoded] == [reference[tuple(p)] for p in prompts]
    assert RECOMPUTED not in decode.tail(400), decode.tail()
    assert_no_leak(prefill, decode)


def test_a_corrupted_prefill_kv_changes_what_decode_decodes(
    model: Path, logs: Path, reference: dict[tuple[int, ...], list[int]],
    closing: list[Instance],
) -> None:  # fmt: skip
    prefill, decode = pair(model, logs, "corrupt", 1, 1)
    closing += [prefill, decode]
    prompts = prompts_of(LENGTHS)
    prefilled = prefill.generate(prompts, prefill_params(len(prompts)))
    prefill.call("corrupt")
    decoded = decode.generate(prompts, decode_params(prefilled, MAX_TOKENS))
    differing = [d["tokens"] != reference[tuple(p)] for p, d in zip(prompts, decoded)]
    assert all(differing), differing


def test_finished_aborted_and_unread_requests_leak_no_block(
    model: Path, logs: Path, reference: dict[tuple[int, ...], list[int]],
    closing: list[Instance],
) -> None:  # fmt: skip
    """Eleven concurrent requests of 8 to 118 tokens: the decode side aborts three before
    they are scheduled (its connector tells the prefill side to free them), two are never
    handed to the decode side (their lease of 5 s frees them), six decode. Both sides end
    with every block free."""
    prefill, decode = pair(model, logs, "leaks", 1, 1, kv_lease_seconds=5)
    closing += [prefill, decode]
    prompts = prompts_of(tuple(range(8, 120, 11)), salt=5)
    prefilled = prefill.generate(prompts, prefill_params(len(prompts)))
    handed = prompts[:-2]
    aborted = [1, 4, 7]
    done = decode.call("generate_aborting", {
        "prompts": handed, "params": decode_params(prefilled[:-2], MAX_TOKENS),
        "abort": aborted,
    })  # fmt: skip
    assert sorted(done) == [i for i in range(len(handed)) if i not in aborted]
    for i, tokens in done.items():
        assert tokens == reference[tuple(handed[i])], i
    assert_no_leak(prefill, decode)


def test_a_killed_prefill_is_recomputed_and_said_so(
    model: Path, logs: Path, reference: dict[tuple[int, ...], list[int]],
    closing: list[Instance],
) -> None:  # fmt: skip
    prefill, decode = pair(model, logs, "killed", 1, 1)
    closing += [prefill, decode]
    prompts = prompts_of(LENGTHS)
    prefilled = prefill.generate(prompts, prefill_params(len(prompts)))
    prefill.kill()
    decoded = decode.generate(prompts, decode_params(prefilled, MAX_TOKENS))
    assert [d["tokens"] for d in decoded] == [reference[tuple(p)] for p in prompts]
    log = decode.tail(400)
    assert "did not answer" in log and RECOMPUTED in log, decode.tail()
    assert decode.call("free_blocks") == decode.initial_free


def test_a_second_architecture_qwen3_decodes_what_one_instance_decodes(
    tmp_path: Path, logs: Path, closing: list[Instance]
) -> None:
    """Qwen3 (q/k norms before the cache): prefill TP 2 -> decode TP 1 through NIXL."""
    model = write_model(tmp_path / "tiny-qwen3", arch="qwen3", seed=1)
    prompts = prompts_of(LENGTHS, salt=3)
    greedy = {"max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True}
    one = Instance(llm_args(model), logs / "qwen3-reference.log")
    closing.append(one)
    want = [o["tokens"] for o in one.generate(prompts, [greedy] * len(prompts))]
    one.close()
    prefill, decode = pair(model, logs, "qwen3-2-1", 2, 1)
    closing += [prefill, decode]
    prefilled = prefill.generate(prompts, prefill_params(len(prompts)))
    decoded = decode.generate(prompts, decode_params(prefilled, MAX_TOKENS))
    assert [d["tokens"] for d in decoded] == want
    assert RECOMPUTED not in decode.tail(400), decode.tail()
    assert_no_leak(prefill, decode)


def test_a_decode_side_serving_another_model_is_refused_naming_the_field(
    model: Path, tmp_path: Path, logs: Path, closing: list[Instance]
) -> None:
    """Decode serves a 3-layer model, prefill the 2-layer one: the handshake names the first
    field that differs, the requests are recomputed on the decode side (their tokens are the
    decode model's own), neither engine crashes, and the prefill frees the unread blocks when
    their lease runs out."""
    # The same name in another folder, so the first field that differs is the layer count.
    other = write_model(tmp_path / model.name, layers=3)
    port = next(_ports)
    prefill = Instance(llm_args(model, connector=pdplan_connector("kv_producer", port,
                                                                  kv_lease_seconds=3)),
                       logs / "mismatch-prefill.log")  # fmt: skip
    closing.append(prefill)
    decode = Instance(llm_args(other, connector=pdplan_connector("kv_consumer", port + 10)),
                      logs / "mismatch-decode.log")  # fmt: skip
    closing.append(decode)
    prompts = prompts_of(LENGTHS)
    prefilled = prefill.generate(prompts, prefill_params(len(prompts)))
    decoded = decode.generate(prompts, decode_params(prefilled, MAX_TOKENS))
    log = decode.tail(400)
    assert "differs in num_layers: 3 there, 2 here" in log, decode.tail()
    assert RECOMPUTED in log
    greedy = {"max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True}
    own = decode.generate(prompts, [greedy] * len(prompts))
    assert [d["tokens"] for d in decoded] == [o["tokens"] for o in own]
    assert_no_leak(prefill, decode)


def test_speculative_decoding_is_served_without_a_draft_cache_refused_with_one(
    model: Path, logs: Path, reference: dict[tuple[int, ...], list[int]],
    closing: list[Instance],
) -> None:  # fmt: skip
    """A decode side speculating by n-grams (no draft cache) decodes through the connector
    what one instance decodes (greedy speculation keeps the greedy tokens); one speculating by
    a draft model, whose KV cache sits beside the model's, is refused when it starts, naming
    the method (vLLM numbers a draft's layers past the model's, or from 0 under another
    prefix: MTP's ``mtp.layers.0``)."""
    port = next(_ports)
    prefill = Instance(llm_args(model, connector=pdplan_connector("kv_producer", port)),
                       logs / "speculative-prefill.log")  # fmt: skip
    closing.append(prefill)
    ngram = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3,
             "prompt_lookup_min": 1}  # fmt: skip
    decode_args = llm_args(model, connector=pdplan_connector("kv_consumer", port + 10))
    decode = Instance({**decode_args, "speculative_config": ngram}, logs / "ngram-decode.log")
    closing.append(decode)
    prompts = prompts_of(LENGTHS)
    prefilled = prefill.generate(prompts, prefill_params(len(prompts)))
    decoded = decode.generate(prompts, decode_params(prefilled, MAX_TOKENS))
    assert [d["tokens"] for d in decoded] == [reference[tuple(p)] for p in prompts]
    assert RECOMPUTED not in decode.tail(400), decode.tail()
    decode.close()
    drafted = {"method": "draft_model", "model": str(model), "num_speculative_tokens": 2}
    args = llm_args(model, connector=pdplan_connector("kv_consumer", port + 20))
    with pytest.raises(RuntimeError, match="did not start") as refused:
        closing.append(Instance({**args, "speculative_config": drafted},
                                logs / "draft-decode.log"))  # fmt: skip
    assert "speculative decoding by 'draft_model' keeps a draft model's KV cache" in str(
        refused.value
    ), str(refused.value)


@pytest.fixture(scope="module")
def one_head_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("one-head") / "tiny-llama-1kv", seed=2, kv_heads=1)


@pytest.mark.parametrize(("prefill_tp", "decode_tp"), [(1, 2), (2, 1)])
def test_one_kv_head_replicated_over_tp_moves_exactly(
    one_head_model: Path, logs: Path, closing: list[Instance], prefill_tp: int, decode_tp: int
) -> None:
    """One KV head, so TP 2 keeps it whole on both ranks. Decode TP 2: each decode rank reads
    its own copy (vLLM's rule). Prefill TP 2: the decode rank reads rank 0's copy and tells
    rank 1, which holds the same blocks, that it is done (a notify-only rank), so neither
    prefill rank leaks."""
    prompts = prompts_of(LENGTHS, salt=9)
    greedy = {"max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True}
    one = Instance(llm_args(one_head_model), logs / f"one-head-ref-{prefill_tp}.log")
    closing.append(one)
    want = [o["tokens"] for o in one.generate(prompts, [greedy] * len(prompts))]
    one.close()
    prefill, decode = pair(one_head_model, logs, f"one-head-{prefill_tp}-{decode_tp}",
                           prefill_tp, decode_tp)  # fmt: skip
    closing += [prefill, decode]
    prefilled = prefill.generate(prompts, prefill_params(len(prompts)))
    decoded = decode.generate(prompts, decode_params(prefilled, MAX_TOKENS))
    assert [d["tokens"] for d in decoded] == want
    assert RECOMPUTED not in decode.tail(400), decode.tail()
    assert_no_leak(prefill, decode)
