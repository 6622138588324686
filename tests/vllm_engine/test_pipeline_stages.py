"""Pipeline stages through PdplanConnector with real vLLM 0.32 instances: an instance of two
stages (TP 1 each, a Llama of a sliding-window layer and a full one, so each stage holds one
KV cache group's layer) against one of TP 2, both ways. Each stage keeps only its layers; its
ranks exchange their buffers at registration and plan with the whole model's, a decode rank
reading each layer from the stage that holds it, on that stage's ports. The oracle: one
instance decodes the prompts alone; every prompt token is loaded, none recomputed.

vLLM's CPU build runs stages only with compilation on (``enforce_eager`` leaves its later
stages without intermediate tensors). Run by scripts/test_vllm.sh (CI), which installs vLLM."""

from __future__ import annotations

from pathlib import Path

import pytest
from families import FAMILIES
from family_runs import GREEDY, _args, connector_config, prompts
from harness import MAX_TOKENS, Instance, decode_params, prefill_params

pytestmark = pytest.mark.vllm

RECOMPUTED = "reported for vLLM to recompute"


def test_stages_and_tp_ranks_pair_both_ways(tmp_path: Path, logs: Path) -> None:
    family = FAMILIES["llama-windowed"]
    model = family.write(tmp_path / family.name, 0)
    staged_args = _args(family, model, 1, connector_config("pdplan", 9800))
    staged_args.update(pipeline_parallel_size=2, enforce_eager=False)
    instances = []
    try:
        staged = Instance(staged_args, logs / "stages-pp2.log")
        instances.append(staged)
        wide = Instance(_args(family, model, 2, connector_config("pdplan", 9820)),
                        logs / "stages-tp2.log")  # fmt: skip
        instances.append(wide)
        for prefill, decode, salt in ((staged, wide, 1), (wide, staged, 2)):
            batch = prompts(salt=salt)
            want = [o["tokens"] for o in prefill.generate(batch, [GREEDY] * len(batch))]
            assert len({t[0] for t in want}) > 1, "the model decodes the same everywhere"
            prefilled = prefill.generate(batch, prefill_params(len(batch)))
            assert {p["kv_transfer_params"]["pp_size"] for p in prefilled} == (
                {2} if prefill is staged else {1}
            )
            before = decode.call("external_tokens")
            outputs = decode.generate(batch, decode_params(prefilled, MAX_TOKENS))
            # The windows' model leaves each prompt's last token to the decode side.
            assert decode.call("external_tokens") - before == sum(len(p) - 1 for p in batch)
            assert RECOMPUTED not in decode.tail(3000), decode.tail()
            assert [o["tokens"] for o in outputs] == want
    finally:
        for instance in instances:
            instance.close()
