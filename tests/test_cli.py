"""The pdplan command: subcommands, formats, exit codes, and JSON that agrees with the
library."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pdplan import (
    ModelShape,
    ParallelLayout,
    PDTransferPlanner,
    __version__,
    limits,
    model_buffer_layouts,
)
from pdplan.cli import main

from layouts import fragment_to_dict

PLAN = ["plan", "--prefill-tp", "8", "--decode-tp", "2", "--model", "llama-3-70b"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_console_script_version_and_help() -> None:
    exe = shutil.which("pdplan")
    assert exe, "pip install puts the pdplan command on PATH"
    done = subprocess.run([exe, "--version"], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stdout.strip() == f"pdplan {__version__}"
    for command in ("demo", "plan", "check"):
        done = subprocess.run([exe, command, "--help"], capture_output=True, text=True, check=False)
        assert done.returncode == 0 and "usage: pdplan " + command in done.stdout
    bad = [exe, "check", "--prefill-tp", "x", "--decode-tp", "1", "--model", "llama-3-8b"]
    done = subprocess.run(bad, capture_output=True, text=True, check=False)
    assert done.returncode == 2 and done.stderr.splitlines() == [
        "pdplan check: error: argument --prefill-tp: expected a whole number, got 'x'",
        "(pdplan check --help lists the options)",
    ]


def test_demo(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "demo")
    assert code == 0
    assert "prefill 8 ranks (1 DP x TP 8) -> decode 2 ranks" in out
    assert "655,360" in out  # bytes per page from each prefill rank: 160 buffers x one head
    assert "2,621,440 descriptors" in out  # 2 decode x 4 prefill x 160 fragments x 2048 pages
    assert "0: 1, 1: 1" in out
    # The model it walks through is named, with its shape (Llama 3 70B: 80 layers).
    assert "model: llama-3-70b (family llama): 80 layers" in out


def test_plan_json_agrees_with_the_library(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, *PLAN, "--prefill-dp", "2", "--decode-dp", "2", "--format", "json")
    assert code == 0
    data = json.loads(out)
    prefill, decode = model_buffer_layouts(ModelShape.preset("llama-3-70b"), 8, 2)
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", 16, 2),
        decode_layout=ParallelLayout("decode", 4, 2),
        prefill_buffers=prefill,
        decode_buffers=decode,
    )
    assert data["source_fanout"] == {str(r): n for r, n in planner.source_fanout.items()}
    assert [p["decode_rank"] for p in data["plans"]] == [0, 1, 2, 3]
    for entry in data["plans"]:
        plan = planner.plan_for_decode_rank(entry["decode_rank"])
        assert entry["plan_kind"] == plan.plan_kind
        assert entry["target_prefill_ranks"] == list(plan.target_prefill_ranks)
        # Head-major plans: the reference's fields only, as the wire format v1 writes them.
        assert entry["fragments"] == {
            str(r): [fragment_to_dict(f) for f in fs]
            for r, fs in plan.fragments_by_prefill_rank.items()
        }


def test_chosen_decode_ranks_and_routing_json(capsys: pytest.CaptureFixture[str]) -> None:
    wide = ["plan", "--prefill-tp", "2", "--decode-tp", "1", "--decode-dp", "4"]
    wide += ["--model", "llama-3-8b"]
    code, out, _ = run(capsys, *wide, "--format", "routing-json")
    assert code == 0
    data = json.loads(out)
    # Four decode DP groups read the one prefill group (ranks 0 and 1): no rank 2 or beyond.
    pairs = [(p["decode_rank"], p["prefill_rank"]) for p in data["pairs"]]
    assert pairs == [(d, p) for d in range(4) for p in range(2)]
    assert {p["bytes_per_page"] for p in data["pairs"]} == {32 * 2 * 4 * 16 * 128 * 2}
    assert data["source_fanout"] == {"0": 1, "1": 1}
    code, out, _ = run(
        capsys, *wide, "--format", "json", "--decode-rank", "3", "--decode-rank", "1"
    )
    assert code == 0
    plans = json.loads(out)["plans"]
    assert [p["decode_rank"] for p in plans] == [3, 1]
    assert sorted(plans[0]["fragments"]) == ["0", "1"]
    code, out, _ = run(capsys, *wide, "--decode-rank", "2")
    assert code == 0
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("2 ")]
    assert [row[:2] for row in rows] == [["2", "0"], ["2", "1"]]
    code, _, err = run(capsys, *wide, "--decode-rank", "4")
    assert code == 2 and "--decode-rank: rank=4 is out of range" in err


def test_plan_table_and_dot(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "plan",
        "--prefill-tp",
        "4",
        "--decode-tp",
        "1",
        "--layers",
        "2",
        "--kv-heads",
        "2",
        "--head-dim",
        "64",
    ]
    code, out, _ = run(capsys, *args)
    assert code == 0 and "plan kind: fragmented" in out
    code, out, _ = run(capsys, *args, "--format", "dot")
    assert code == 0 and out.startswith("digraph pdplan {")
    # GQA: prefill ranks 0 and 2 lead the two replica groups; 1 and 3 send nothing but hold
    # the same heads, so they hear "done" (a dashed notify edge).
    assert '"P0" -> "D0" [label="8192 B/page, 4 fragments"]' in out
    assert '"P2" -> "D0" [label="8192 B/page, 4 fragments"]' in out
    assert '"P1" -> "D0" [label="notify", style=dashed]' in out


def test_config_option(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "num_hidden_layers": 4,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "hidden_size": 4096,
            }
        )
    )
    code, out, _ = run(
        capsys, "check", "--prefill-tp", "8", "--decode-tp", "4", "--config", str(config)
    )
    # The model (its folder and the family that read it), then the verdict.
    assert code == 0 and out.startswith(f"model: {tmp_path.name} (family llama): 4 layers")
    assert "\nsupported: fragmented plan, 8 buffers" in out


def test_an_unknown_architecture_exits_2_saying_how_to_choose_a_family(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "config.json"
    shape = {"num_hidden_layers": 4, "num_attention_heads": 32, "hidden_size": 4096}
    config.write_text(json.dumps({"architectures": ["BrandNewForCausalLM"], **shape}))
    args = ("check", "--prefill-tp", "8", "--decode-tp", "4", "--config", str(config))
    code, out, err = run(capsys, *args)
    assert code == 2 and out == ""
    assert "BrandNewForCausalLM" in err and "--family" in err and "nemotron-nas" in err
    code, out, _ = run(capsys, *args, "--family", "llama")
    assert code == 0 and "(family llama): 4 layers" in out
    code, _, err = run(capsys, *args, "--family", "llama5")
    assert code == 2 and 'unknown model family "llama5"' in err
    code, _, err = run(
        capsys,
        "check",
        "--prefill-tp",
        "8",
        "--decode-tp",
        "4",
        "--model",
        "llama-3-8b",
        "--family",
        "llama",
    )
    assert code == 2 and "--family chooses the reader of a config.json" in err


def test_models_lists_every_family(capsys: pytest.CaptureFixture[str]) -> None:
    from pdplan import model_families

    code, out, _ = run(capsys, "models")
    assert code == 0
    for family in model_families():
        assert f"{family.name}: {', '.join(family.architectures)}\n" in out
    assert "DeciLMForCausalLM" in out and "block_configs" in out
    code, out, _ = run(capsys, "models", "--format", "json")
    listed = json.loads(out)
    assert [f["name"] for f in listed] == [f.name for f in model_families()]


def test_check_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        capsys, "check", "--prefill-tp", "8", "--decode-tp", "8", "--model", "llama-3-8b"
    )
    assert code == 0 and "\nsupported: identity plan" in out
    code, out, err = run(
        capsys, "check", "--prefill-tp", "8", "--decode-tp", "3", "--model", "llama-3-70b"
    )
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("unsupported: decode side")
    assert "would work: decode TP 1, 2, 4, 8, 16, 24" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan", "--prefill-tp", "8", "--decode-tp", "2"], "give exactly one model"),
        (["plan", "--prefill-tp", "8", "--decode-tp", "2", "--layers", "2"], "go together"),
        ([*PLAN, "--config", "x.json"], "give exactly one model"),
        (
            ["plan", "--prefill-tp", "8", "--decode-tp", "2", "--config", "/no/such.json"],
            "cannot read",
        ),
        (
            [
                "plan",
                "--prefill-tp",
                "8",
                "--decode-tp",
                "2",
                "--layers",
                "2",
                "--kv-heads",
                "8",
                "--head-dim",
                "64",
                "--dtype",
                "int3",
            ],
            "unknown dtype",
        ),
    ],
)
def test_user_errors_are_one_line_without_traceback(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "--prefill-tp", "0", "--decode-tp", "2", "--model", "llama-3-8b"],
        ["plan", "--prefill-tp", "x", "--decode-tp", "2", "--model", "llama-3-8b"],
        ["plan", "--decode-tp", "2", "--model", "llama-3-8b"],
        ["plan", "--prefill-tp", "2", "--decode-tp", "2", "--model", "gpt-5"],
        ["launch"],
    ],
)
def test_bad_arguments_exit_2_with_a_line_and_a_hint(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "usage:" not in err and len(err.splitlines()) == 2
    assert err.startswith("pdplan") and ": error: " in err and "--help lists the" in err


def test_decode_replicas_and_kv_layout(capsys: pytest.CaptureFixture[str]) -> None:
    wide = ["--prefill-tp", "16", "--decode-tp", "32", "--model", "llama-3-70b"]
    code, out, _ = run(capsys, "check", *wide)
    # The default serves the first rank of each decode replica group only, and says so.
    assert code == 0 and "24 of 32 decode ranks receive nothing" in out
    assert "--decode-replicas all" in out
    code, out, _ = run(capsys, "check", *wide, "--decode-replicas", "all")
    assert code == 0 and "receive nothing" not in out
    code, out, _ = run(
        capsys, "plan", *wide, "--decode-replicas", "all", "--format", "routing-json"
    )
    data = json.loads(out)
    assert sorted({p["decode_rank"] for p in data["pairs"]}) == list(range(32))
    assert set(data["source_fanout"].values()) == {2}  # 32 decode ranks over 16 prefill ranks
    nhd = ["plan", "--prefill-tp", "8", "--decode-tp", "2", "--model", "llama-3-8b"]
    code, out, _ = run(capsys, *nhd, "--kv-layout", "NHD", "--format", "json", "--decode-rank", "0")
    assert code == 0
    fragment = json.loads(out)["plans"][0]["fragments"]["0"][0]
    # One head of 16 tokens x 128 x bf16 from each prefill rank: a 256-byte run per token row.
    assert (fragment["rows_per_page"], fragment["bytes_per_page"]) == (16, 4096)
    assert (fragment["src_row_stride_bytes"], fragment["dst_row_stride_bytes"]) == (256, 1024)


def test_pipeline_stages(capsys: pytest.CaptureFixture[str]) -> None:
    staged = ["--prefill-tp", "2", "--prefill-pp", "2", "--decode-tp", "4", "--layers", "5"]
    staged += ["--kv-heads", "4", "--head-dim", "64", "--prefill-pp-partition", "3,2"]
    code, out, _ = run(capsys, "plan", *staged)
    assert code == 0 and "(1 DP x PP 2 x TP 2)" in out
    # Layers 0-2 come from stage 0 (6 buffers), layers 3-4 from stage 1 (4 buffers).
    assert "0 (stage 0)         0 (stage 0)          6" in out
    assert "0 (stage 0)         2 (stage 1)          4" in out
    code, _, err = run(capsys, "check", *staged[:-1], "2,2")
    assert code == 2 and "covers 4 layers" in err
    # A one-stage partition of the model's layers is no stage at all: planned as without one.
    one = ["--prefill-tp", "2", "--decode-tp", "1", "--model", "llama-3-8b"]
    code, out, err = run(capsys, "plan", *one, "--prefill-pp-partition", "32")
    assert code == 0 and "1 DP x TP 2" in out, err
    code, _, err = run(capsys, "check", *one, "--prefill-pp-partition", "30", "--decode-pp", "2")
    assert code == 2 and "covers 30 layers, but the buffers name layers 0..32" in err
    # The core judges the counts (the command only reads them).
    code, _, err = run(capsys, "check", *staged[:-1], "5,0")
    assert code == 2 and "every stage must hold at least one layer" in err
    with pytest.raises(SystemExit):
        main(["plan", *staged[:-1], "3,x"])


def test_page_sizes_that_differ_plan_by_token_and_count_a_request(
    capsys: pytest.CaptureFixture[str],
) -> None:
    sizes = ["--prefill-page-size", "16", "--decode-page-size", "64"]
    code, out, _ = run(capsys, *PLAN, *sizes)
    assert code == 0
    assert "16-token prefill pages, 64-token decode pages (token maps)" in out
    # Each 16-token source page lands inside one 64-token decode page: one descriptor per
    # fragment and source page, 160 fragments x 2048 pages x 8 rank pairs.
    assert "by slot maps): 2,621,440 descriptors moving 10.00 GiB over 8 rank pairs" in out
    check = ["check", "--prefill-tp", "8", "--decode-tp", "2", "--model", "llama-3-70b"]
    code, out, _ = run(capsys, *check, "--kv-layout", "NHD", "--prefill-page-size", "64")
    assert code == 0 and "supported" in out
    # Token-major rows of one head into rows of four: a descriptor per token, 32,768 x 160 x 8.
    assert "41,943,040 descriptors" in out
    code, out, _ = run(capsys, *check)
    assert code == 0 and "by pages): 2,621,440 descriptors" in out
    code, _, err = run(capsys, *check, "--decode-page-size", "2097152")
    assert code == 2 and "page_size=2097152 must be between 1 and 1048576 tokens" in err


def test_the_model_is_summarized_per_layer_kind_before_the_plan(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, _ = run(
        capsys, "plan", "--prefill-tp", "2", "--decode-tp", "4", "--model", "nemotron-h-8b"
    )
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == (
        "model: nemotron-h-8b (family nemotron-h): 52 layers (bfloat16; KV cache bfloat16, "
        "states bfloat16)"
    )
    # 128 heads x 64 x 128 state x 2 bytes, plus conv (8192 + 2 x 1024 channels) x 3 x 2 bytes.
    mamba = 128 * 64 * 128 * 2 + (8192 + 2048) * 3 * 2
    assert f"24 x Mamba2: {mamba:,} B of state a request; layers 0, 2, 4, 6, 9, 11, ... 50" in out
    assert "4 x full attention: 4,096 B a token; layers 7, 18, 29, 40" in out
    assert "24 x MLP only (no cache): no cache" in out
    assert lines[4].startswith("prefill ")  # the summary comes first
    # A window model: the request's KV with and without its windows, and the descriptors that
    # move it by slot maps move the windowed bytes.
    code, out, _ = run(
        capsys, "check", "--prefill-tp", "2", "--decode-tp", "1", "--model", "gpt-oss-20b"
    )
    assert code == 0
    full = 12 * 8 * 64 * 2 * 2 * 32768  # 12 full layers, K and V, 32k tokens
    windowed = full + 12 * 8 * 64 * 2 * 2 * 128
    assert (
        f"{windowed / 2**30:.2f} GiB moved with sliding windows, {2 * full / 2**30:.2f} GiB without"
        in out
    )
    assert (
        "(scattered pages, by slot maps): " in out and f"moving {windowed / 2**30:.2f} GiB" in out
    )
    # Llama 4: a 32k-token request ends a chunk of 8,192, so its 36 chunked layers move no
    # token and only the 12 NoPE layers' KV moves (8 heads x 128 x K and V x 2 bytes).
    code, out, _ = run(
        capsys, "check", "--prefill-tp", "8", "--decode-tp", "2", "--model", "llama-4-scout"
    )
    nope = 12 * 8 * 128 * 2 * 2 * 32768
    assert code == 0 and "model: llama-4-scout (family llama4): 48 layers" in out
    assert (
        f"{nope / 2**30:.2f} GiB moved with attention chunks, {4 * nope / 2**30:.2f} GiB without"
        in out
    )
    assert f"moving {nope / 2**30:.2f} GiB" in out
    # Cache dtypes from the command line: NVFP4 halves and a bit more (values + scales).
    code, out, _ = run(capsys, *PLAN, "--kv-cache-dtype", "nvfp4", "--state-dtype", "float32")
    assert code == 0 and "KV cache nvfp4, states float32" in out
    assert f"{8 * 2 * (64 + 8):,} B a token" in out
    # A config file as Hugging Face writes it (a bare Infinity), read and summarized.
    config = tmp_path / "config.json"
    config.write_text(
        '{"model_type": "mamba2", "num_hidden_layers": 2, "hidden_size": 64, "num_heads": 4,'
        ' "head_dim": 32, "state_size": 16, "n_groups": 2, "conv_kernel": 4,'
        ' "time_step_limit": [0.0, Infinity]}'
    )
    code, out, err = run(
        capsys, "check", "--prefill-tp", "2", "--decode-tp", "1", "--config", str(config)
    )
    assert code == 0, err
    assert "2 x Mamba2" in out
    config.write_text(
        '{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2,'
        ' "num_attention_heads": 2, "attn_layer_indices": [1]}'
    )
    code, _, err = run(
        capsys, "check", "--prefill-tp", "2", "--decode-tp", "1", "--config", str(config)
    )
    assert code == 2 and "attn_layer_indices" in err and "Traceback" not in err


def test_context_parallel_options(capsys: pytest.CaptureFixture[str]) -> None:
    """DeepSeek-V3 (61 MLA layers, 1,152 B a token) into decode TP 8 x DCP 8: at interleave 1
    a decode rank's neighbouring tokens sit 8 slots apart on the prefill rank, so every token
    of every layer is one descriptor; at interleave 16 (the page size) a page is one."""
    base = ["--model", "deepseek-v3", "--prefill-tp", "8", "--decode-tp", "8", "--decode-dcp", "8"]
    tokens, layers = 32 * 1024, 61
    for interleave, per_descriptor in ((1, 1), (16, 16)):
        code, out, _ = run(capsys, "check", *base, "--interleave", str(interleave))
        assert code == 0, out
        count = layers * tokens // per_descriptor
        assert f"{count:,} descriptors moving 2.14 GiB" in out
        assert f"{1152 * per_descriptor:,} B a descriptor" in out
        assert f"decode DCP 8 (interleave {interleave})" in out
    code, out, _ = run(capsys, "plan", *base, "--format", "routing-json")
    rows = json.loads(out)["pairs"]
    moving = {(r["decode_rank"], r["prefill_rank"]) for r in rows if r["fragments"]}
    assert moving == {(d, d) for d in range(8)}
    # The other seven prefill ranks hold the same MLA cache: each decode rank notifies them.
    notify = {(r["decode_rank"], r["prefill_rank"]) for r in rows if not r["fragments"]}
    assert notify == {(d, p) for d in range(8) for p in range(8) if p != d}
    # Prefill DCP 8 -> decode DCP 4: each decode rank reads its residue's two prefill ranks.
    code, out, _ = run(
        capsys,
        "check",
        *base[:-4],
        "--prefill-dcp",
        "8",
        "--decode-tp",
        "4",
        "--decode-dcp",
        "4",
    )
    assert code == 0 and "decode rank 0 reads from 2 prefill rank(s)" in out
    # A zigzag prefill CP beside TP: world sizes count the CP ranks.
    code, out, _ = run(
        capsys,
        "plan",
        "--model",
        "llama-3-70b",
        "--prefill-tp",
        "2",
        "--prefill-cp",
        "2",
        "--cp-split",
        "zigzag",
        "--decode-tp",
        "2",
    )
    assert code == 0 and "prefill 4 ranks (1 DP x CP 2 x TP 2)" in out
    assert "prefill CP 2 (zigzag)" in out


def test_check_says_which_context_parallel_layouts_work(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run(
        capsys,
        "check",
        "--model",
        "nemotron-h-8b",
        "--prefill-tp",
        "2",
        "--prefill-cp",
        "2",
        "--decode-tp",
        "2",
    )
    assert code == 2
    assert "layer 0 (Mamba2)" in err and "state with CP is not supported" in err
    assert "would work: the same TP sizes without context parallelism" in err
    # 8 KV heads at decode TP 16: replica groups of 2, so DCP 2 works and DCP 4 does not.
    code, _, err = run(
        capsys,
        "check",
        "--model",
        "llama-3-70b",
        "--prefill-tp",
        "8",
        "--decode-tp",
        "16",
        "--decode-dcp",
        "4",
    )
    assert code == 2 and "must divide the decode side's replica group" in err
    assert "would work: decode DCP 2" in err
    code, _, err = run(
        capsys,
        "check",
        "--model",
        "llama-3-70b",
        "--prefill-tp",
        "2",
        "--prefill-cp",
        "2",
        "--prefill-dcp",
        "2",
        "--decode-tp",
        "2",
    )
    assert code == 2 and "one way only" in err


def section(out: str, header: str) -> list[str]:
    """The rank-pair lines under the line starting with `header`, up to the next header."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rest = lines[start + 1 :]
    end = next((i for i, line in enumerate(rest) if not line.startswith("  ")), len(rest))
    return [line for line in rest[:end] if line.startswith("  decode<-prefill")]


def staging_lines(out: str) -> list[str]:
    return section(out, "staging it, per rank pair")


def test_check_shows_the_descriptor_form_the_cost_model_chooses(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Llama-3-70B at TP 8 -> 2, head-major, consecutive pages: per pair 80 layers x K and V
    # x 2,048 pages = 327,680 descriptors flat, or 160 strided rows (one a buffer: a page run).
    # 10 GiB over 8 pairs = 1.25 GiB a pair.
    base = ["check", "--model", "llama-3-70b", "--prefill-tp", "8", "--decode-tp", "2"]
    never_staged = ["--per-copy-us", "1e9"]
    code, out, _ = run(capsys, *base, *never_staged)
    [line] = section(out, "descriptor forms")
    assert code == 0 and "in 327,680 descriptors" in line and "in 160 rows" in line
    # Strided: 160 x 0.1539 µs + 327,680 x 0.1161 µs = 38.1 ms against 88.5 ms flat (the wire's
    # 1.25 GiB at 50 GB/s is 26.8 ms: posting bounds both).
    assert "strided 38.1 ms" in line and line.endswith("-> strided (38.1 ms)")
    # A block dearer than a flat descriptor: flat.
    _, out, _ = run(capsys, *base, *never_staged, "--per-block-us", "0.3")
    [line] = section(out, "descriptor forms")
    assert line.endswith("-> flat (88.5 ms)")
    # Staging at the default copies (28.5 ms, as the staging line says) beats both.
    _, out, _ = run(capsys, *base)
    [line] = section(out, "descriptor forms")
    assert line.endswith("-> staging (28.5 ms)")


def test_check_weighs_staging_per_rank_pair(capsys: pytest.CaptureFixture[str]) -> None:
    llama = ["check", "--model", "llama-3-70b", "--page-size", "64"]
    code, out, _ = run(
        capsys, *llama, "--prefill-tp", "8", "--decode-tp", "2", "--kv-layout", "NHD"
    )
    assert code == 0
    # Token-major 8 -> 2 with scattered pages: a row of one head (128 x bf16) per token and
    # buffer, 80 layers x K and V x 32,768 tokens for each of the 8 pairs.
    [line] = staging_lines(out)
    assert "(8 pairs): 5,242,880 descriptors of 256 B" in line and line.endswith("-> staging")
    assert "in 1 descriptor(s)" in line
    # Head-major 2 -> 8: one 64-token head slice a page and buffer, 16 KiB: the wire's bytes
    # outlast the descriptors, and staging only adds copies.
    code, out, _ = run(capsys, *llama, "--prefill-tp", "2", "--decode-tp", "8")
    [line] = staging_lines(out)
    assert "81,920 descriptors of 16,384 B" in line and line.endswith("-> direct")
    # The figures are flags: a dearer descriptor tips it; chunks multiply the descriptors.
    code, out, _ = run(
        capsys,
        *llama,
        "--prefill-tp",
        "2",
        "--decode-tp",
        "8",
        "--per-descriptor-us",
        "2",
        "--chunk-bytes",
        str(1 << 20),
    )
    [line] = staging_lines(out)
    assert line.endswith("-> staging") and "in 1,280 descriptor(s)" in line  # 1.25 GiB / 1 MiB
    assert "2 µs a descriptor" in out
    for flag, value in (("--copy-gbyte", "0"), ("--per-copy-us", "-1"), ("--network-gbit", "x")):
        with pytest.raises(SystemExit) as exit_:
            main([*llama, "--prefill-tp", "2", "--decode-tp", "8", flag, value])
        assert exit_.value.code == 2 and flag in capsys.readouterr().err


def test_the_command_runs_as_a_module_too() -> None:
    import subprocess
    import sys

    import pdplan

    done = subprocess.run(
        [sys.executable, "-m", "pdplan.cli", "--version"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0 and done.stdout.strip() == f"pdplan {pdplan.__version__}"


GQA_16_TO_4 = ["check", "--prefill-tp", "16", "--decode-tp", "4", "--model", "llama-3-70b"]


def gone(*ranks: int) -> list[str]:
    return [arg for rank in ranks for arg in ("--unavailable-prefill-rank", str(rank))]


def test_check_reports_a_failover_that_loses_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    # 8 KV heads over prefill TP 16: ranks 0 and 1 both hold head 0; decode rank 0 holds heads
    # 0 and 1 (ranks 0-1 and 2-3), so with rank 0 gone it reads head 0 from rank 1.
    code, out, _ = run(capsys, *GQA_16_TO_4, *gone(0))
    assert code == 0
    assert "failover: prefill rank(s) 0 unavailable" in out
    assert "decode rank 0: from prefill rank(s) 1-2 (was 0, 2); lost: nothing" in out
    assert "decode rank 1: from prefill rank(s) 4, 6; lost: nothing" in out
    assert "largest fanout: 1 (was 1)" in out
    assert "complete: every byte is read from a prefill rank still up" in out


def test_check_reports_what_is_lost_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, *GQA_16_TO_4, "--prefill-dp", "2", "--decode-dp", "2", *gone(0, 1))
    assert code == 2
    assert "decode rank 0: from prefill rank(s) 2 (was 0, 2); lost: head 0 of layer(s) 0-79 " in out
    assert "(target_k, target_v)" in out
    # Decode DP group 1 reads prefill DP group 1, whose ranks are all up.
    assert "decode DP group(s) 1: every prefill rank they read is up; plans unchanged" in out
    assert "incomplete:" in out


def test_check_reports_every_rank_gone(capsys: pytest.CaptureFixture[str]) -> None:
    mla = ["check", "--prefill-tp", "8", "--decode-tp", "2", "--model", "deepseek-v3"]
    code, out, _ = run(capsys, *mla, *gone(*range(8)))
    assert code == 2
    assert "every prefill rank is unavailable: nothing can be served" in out
    assert "decode rank 1: from nobody (was 4); lost: all of layer(s) 0-60 (target_k)" in out
    assert "largest fanout: 0 (was 1)" in out
    # One rank left serves both decode ranks: fanout 2, nothing lost.
    code, out, _ = run(capsys, *mla, *gone(*range(1, 8)))
    assert code == 0
    assert "decode rank 1: from prefill rank(s) 0 (was 4); lost: nothing" in out
    assert "largest fanout: 2 (was 1)" in out


@pytest.mark.parametrize(
    ("ranks", "message"),
    [
        (["16"], "unavailable prefill rank 16 is out of range: the prefill world has 16 ranks"),
        (["3", "3"], "unavailable prefill rank 3 is named twice"),
        (["-1"], "expected a rank >= 0, got -1"),
        (["x"], "expected a rank number, got 'x'"),
    ],
)
def test_check_refuses_bad_unavailable_ranks(
    capsys: pytest.CaptureFixture[str], ranks: list[str], message: str
) -> None:
    argv = [arg for rank in ranks for arg in ("--unavailable-prefill-rank", rank)]
    try:
        code, _, err = run(capsys, *GQA_16_TO_4, *argv)
    except SystemExit as exit_:  # argparse's own refusals
        code, err = int(exit_.code or 0), capsys.readouterr().err
    assert code == 2
    assert message in err


# The command as a user meets it: a process of its own, its words on stderr and its exit code.


def pdplan(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pdplan.cli", *argv],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
        timeout=120,
    )


CHECK_8B = ["check", "--prefill-tp", "2", "--decode-tp", "1", "--model", "llama-3-8b"]
SUBCOMMAND_HINT = "({} --help lists the options)"
TOP_HINT = "(pdplan --help lists the commands: demo, plan, check, cost, models)"


@pytest.mark.parametrize(
    ("argv", "prog", "named"),
    [
        (["check", "--prefill-tp", "x", "--decode-tp", "1", "--model", "llama-3-8b"],
         "pdplan check", "argument --prefill-tp: expected a whole number, got 'x'"),
        (["plan", "--prefill-tp", "2", "--decode-tp", "1", "--model", "llama-3-8b", "--format",
          "yaml"], "pdplan plan", "argument --format: invalid choice: 'yaml'"),
        (["plan", "--decode-tp", "2", "--model", "llama-3-8b"], "pdplan plan",
         "the following arguments are required: --prefill-tp"),
        ([*CHECK_8B, "--chunk-bytes", "-5"], "pdplan check", "argument --chunk-bytes"),
        ([*CHECK_8B, "--bogus", "3"], "pdplan check", "unrecognized arguments: --bogus 3"),
        (["models", "--format", "yaml"], "pdplan models", "argument --format"),
        (["demo", "--fast"], "pdplan demo", "unrecognized arguments: --fast"),
        (["launch"], "pdplan", "argument COMMAND: invalid choice: 'launch'"),
        ([], "pdplan", "the following arguments are required: COMMAND"),
    ],
)  # fmt: skip
def test_a_refused_flag_is_one_line_and_a_hint_not_the_usage(
    argv: list[str], prog: str, named: str
) -> None:
    done = pdplan(*argv)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 2, done.stderr
    assert lines[0].startswith(f"{prog}: error: {named}"), lines[0]
    assert lines[1] == (TOP_HINT if prog == "pdplan" else SUBCOMMAND_HINT.format(prog))


LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 4,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
}


def write(path: Path, content: str | bytes | dict[str, object]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def too_large(path: Path) -> None:
    """A file one byte past the config bound, holding no data (sparse)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        f.truncate(limits.MAX_CONFIG_BYTES + 1)


# (what the user gives, how the tmp folder is filled, what the message says besides the path)
CONFIG_ERRORS = [
    ("zebra/absent-7.json", None, "no such file or folder"),
    ("walrus-absent-folder/", None, "no such file or folder"),
    ("zebra/notjson-7.json", "not json at all", "is not valid JSON"),
    ("zebra/list-7.json", "[1, 2]", "must hold a JSON object"),
    ("zebra/brandnew-7.json", {"architectures": ["BrandNewForCausalLM"]}, "--family"),
    ("zebra/nolayers-7.json", {"architectures": ["LlamaForCausalLM"]}, "num_hidden_layers"),
    ("zebra/latin1-7.json", b'{"architectures": ["\xe9"]}', "UTF-8"),
    ("zebra/huge-7.json", too_large, "pdplan.limits.MAX_CONFIG_BYTES"),
    ("walrus-empty-folder", "folder", "without a config.json"),
]


@pytest.mark.parametrize("flag", ["--config", "--model"])
@pytest.mark.parametrize(
    ("given", "content", "says"), CONFIG_ERRORS, ids=[c[0] for c in CONFIG_ERRORS]
)
def test_a_config_error_names_the_path_given(
    tmp_path: Path, flag: str, given: str, content: object, says: str
) -> None:
    if content == "folder":
        (tmp_path / given).mkdir()
    elif content is too_large:
        too_large(tmp_path / given)
    elif isinstance(content, (str, bytes, dict)):
        write(tmp_path / given, content)
    done = pdplan("check", "--prefill-tp", "2", "--decode-tp", "1", flag, given, cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    [line] = done.stderr.splitlines()
    # Named as typed (relative to where the command ran), never as "config.json".
    assert line.startswith("pdplan: ") and given in line and says in line, line


def test_a_config_error_inside_a_folder_names_the_file_read(tmp_path: Path) -> None:
    write(tmp_path / "zebra-model" / "config.json", {"architectures": ["LlamaForCausalLM"]})
    done = pdplan("check", "--prefill-tp", "2", "--decode-tp", "1", "--config", "zebra-model",
                  cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.startswith(f"pdplan: {os.path.join('zebra-model', 'config.json')} has no ")


def test_an_unreadable_path_is_named_with_the_system_s_reason(tmp_path: Path) -> None:
    # A path through a file cannot be read by anyone, root included (CI runs as root).
    write(tmp_path / "zebra-file.json", LLAMA)
    given = os.path.join("zebra-file.json", "config.json")
    done = pdplan("check", "--prefill-tp", "2", "--decode-tp", "1", "--config", given,
                  cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr == f"pdplan: cannot read {given}: Not a directory\n"


def test_a_model_folder_plans_as_its_config_json(tmp_path: Path) -> None:
    write(tmp_path / "walrus-13b" / "config.json", LLAMA)
    ways = [
        ("--model", "walrus-13b"),
        ("--config", "walrus-13b/"),
        ("--config", "walrus-13b/config.json"),
        ("--model", str(tmp_path / "walrus-13b")),
    ]
    plans = []
    for flag, given in ways:
        done = pdplan("plan", "--prefill-tp", "8", "--decode-tp", "2", flag, given,
                      "--format", "json", cwd=tmp_path)  # fmt: skip
        assert done.returncode == 0, done.stderr
        plans.append(json.loads(done.stdout))
    assert all(plan == plans[0] for plan in plans)
    # The config's shape: 4 layers x K and V, the 8 KV heads of 128 dims over prefill TP 8.
    layers = plans[0]["model"]["layer_kinds"]
    assert plans[0]["buffers"] == 8 and len(layers) == 4
    assert {(layer["kv_heads"], layer["head_dim"]) for layer in layers} == {(8, 128)}
    assert [p["target_prefill_ranks"] for p in plans[0]["plans"]] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    done = pdplan("check", "--prefill-tp", "8", "--decode-tp", "2", "--model", ".",
                  cwd=tmp_path / "walrus-13b")  # fmt: skip
    assert done.returncode == 0 and done.stdout.startswith("model: walrus-13b (family llama)")


def model_line_name(given: str, cwd: Path) -> str:
    done = pdplan("check", "--prefill-tp", "2", "--decode-tp", "1", "--config", given, cwd=cwd)
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith("model: ") and " (family llama): 4 layers" in first, first
    return first.removeprefix("model: ").split(" (family llama)")[0]


def test_the_model_is_named_by_its_path(tmp_path: Path) -> None:
    # The config's own _name_or_path (a training run's folder, or a fine-tune's base model)
    # names another model: never this one's name.
    named = {**LLAMA, "_name_or_path": "/scratch/run-41/checkpoint-900"}
    write(tmp_path / "walrus-13b" / "config.json", named)
    write(tmp_path / "configs" / "llama3-70b.json", named)
    write(tmp_path / "configs" / "tuned.v2.json", LLAMA)
    assert model_line_name("walrus-13b", tmp_path) == "walrus-13b"  # a folder: its name
    assert model_line_name("walrus-13b/", tmp_path) == "walrus-13b"
    assert model_line_name(".", tmp_path / "walrus-13b") == "walrus-13b"
    assert model_line_name("walrus-13b/config.json", tmp_path) == "walrus-13b"  # its folder's
    assert model_line_name("config.json", tmp_path / "walrus-13b") == "walrus-13b"
    assert model_line_name("configs/llama3-70b.json", tmp_path) == "llama3-70b"  # its stem
    assert model_line_name(str(tmp_path / "configs" / "tuned.v2.json"), tmp_path) == "tuned.v2"


def test_a_hugging_face_cache_snapshot_is_named_by_its_repository(tmp_path: Path) -> None:
    # The cache's layout: models--ORG--NAME/snapshots/REVISION/config.json, a link to a blob.
    repository = tmp_path / "hub" / "models--acme--Walrus-13B"
    write(repository / "blobs" / "5f1e0c9a", LLAMA)
    snapshot = repository / "snapshots" / "0123456789abcdef"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").symlink_to(Path("..", "..", "blobs", "5f1e0c9a"))
    assert model_line_name(str(snapshot), tmp_path) == "acme/Walrus-13B"
    assert model_line_name(str(snapshot / "config.json"), tmp_path) == "acme/Walrus-13B"


def test_dtype_with_a_model_is_honoured_not_ignored(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, *CHECK_8B)
    assert code == 0 and "(bfloat16; KV cache bfloat16" in out and "4,096 B a token" in out
    code, out, _ = run(capsys, *CHECK_8B, "--dtype", "float32")
    # 8 KV heads x 128 x K and V, four bytes a value.
    assert code == 0 and "(float32; KV cache float32" in out and "8,192 B a token" in out
    code, _, err = run(capsys, *CHECK_8B, "--dtype", "int3")
    assert code == 2 and "int3" in err


def test_models_lists_presets_and_declared_ignored_keys(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "models")
    assert code == 0
    llama = out.split("\nmistral: ", 1)[0]
    assert "presets: llama-3-8b, llama-3-70b, llama-3-70b-eagle" in llama
    mimo = out.split("\nmimo-v2: ", 1)[1].split("\n  rule:", 1)[0]
    assert "ignored: attention_chunk_size (vLLM models/mimo_v2.py" in mimo


def test_check_reads_a_model_folders_quant_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A ModelOpt export's folder: config.json without a quantization config, and
    hf_quant_config.json naming an FP8 KV cache (as vLLM reads it, the cache is fp8)."""
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "num_hidden_layers": 2, "num_attention_heads": 32, "num_key_value_heads": 8,
              "hidden_size": 4096, "torch_dtype": "bfloat16"}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    side = {"producer": {"name": "modelopt"},
            "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}  # fmt: skip
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(side))
    argv = ["check", "--prefill-tp", "1", "--decode-tp", "1", "--config", str(tmp_path)]
    code, out, _ = run(capsys, *argv)
    # 8 KV heads x 128 x K and V, one byte a value.
    assert code == 0 and "KV cache float8_e4m3fn" in out and "2,048 B a token" in out
    code, out, _ = run(capsys, *argv, "--kv-cache-dtype", "bfloat16")
    assert code == 0 and "4,096 B a token" in out
