"""The ``pdplan`` command: who talks to whom, how many bytes, how many descriptors.

    pdplan demo
    pdplan plan --prefill-tp 8 --decode-tp 2 --model llama-3-70b \
        [--format table|json|routing-json|dot] [--decode-rank N ...]
    pdplan check --prefill-tp 8 --decode-tp 3 --model llama-3-70b

User errors print one line and exit 2; there is no traceback for them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal, TextIO

from pdplan import _core
from pdplan._core import encode_transfer_fragments
from pdplan._descriptors import transfer_descriptors
from pdplan._layouts import (
    MODEL_PRESETS,
    LayerKindSummary,
    ModelShape,
    even_layer_partition,
    model_buffer_layouts,
    model_families,
)
from pdplan._model import BufferLayout, ParallelLayout, UnsupportedPDLayoutError
from pdplan._planner import PDTransferPlanner
from pdplan._request import PairRequest, page_sizes, request_pairs
from pdplan._staging import CostModel

EXIT_UNSUPPORTED = 2
DEMO_MODEL = "llama-3-70b"
#: Runs of the demo's descriptor build: one cold, the rest warm.
DEMO_RUNS = 4
#: The request `plan` and `check` count descriptors for.
REQUEST_TOKENS = 32768


class UserError(Exception):
    """A problem with what the user asked for: one line, exit 2."""


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value}")
    return value


def _real(text: str, positive: bool) -> float:
    """A finite number of at least 0 (above 0 when `positive`)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 <= value < float("inf") or (positive and value == 0):
        what = "positive" if positive else "non-negative"
        raise argparse.ArgumentTypeError(f"expected a finite, {what} number, got {text!r}")
    return value


def _non_negative(text: str) -> float:
    return _real(text, positive=False)


def _positive_real(text: str) -> float:
    return _real(text, positive=True)


def _cost_model(args: argparse.Namespace) -> CostModel:
    return CostModel(
        per_descriptor_s=args.per_descriptor_us * 1e-6,
        network_bytes_per_s=args.network_gbit * 1e9 / 8,
        copy_bytes_per_s=args.copy_gbyte * 1e9,
        per_copy_s=args.per_copy_us * 1e-6,
        per_segment_s=args.per_segment_ns * 1e-9,
    )


def _rank(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a rank number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a rank >= 0, got {value}")
    return value


def _partition(text: str) -> tuple[int, ...]:
    """Layer counts as written; whether they make a partition is the core's to say."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected layer counts separated by commas, got {text!r}"
        ) from None


def _layout_options(parser: argparse.ArgumentParser) -> None:
    sides = parser.add_argument_group("parallel layouts")
    sides.add_argument("--prefill-tp", type=_positive, required=True, help="TP size per DP group")
    sides.add_argument("--prefill-dp", type=_positive, default=1, help="DP groups (default 1)")
    sides.add_argument("--decode-tp", type=_positive, required=True, help="TP size per DP group")
    sides.add_argument("--decode-dp", type=_positive, default=1, help="DP groups (default 1)")
    sides.add_argument("--prefill-pp", type=_positive, default=1, help="pipeline stages (1)")
    sides.add_argument("--decode-pp", type=_positive, default=1, help="pipeline stages (1)")
    sides.add_argument(
        "--prefill-pp-partition",
        type=_partition,
        metavar="N,N,...",
        help="layers of each prefill stage (default: as even as possible, first stages more)",
    )
    sides.add_argument(
        "--decode-pp-partition", type=_partition, metavar="N,N,...", help="layers a decode stage"
    )
    context = parser.add_argument_group(
        "context parallelism (tokens spread over ranks; one kind a side)"
    )
    for side in ("prefill", "decode"):
        context.add_argument(
            f"--{side}-cp",
            type=_positive,
            default=1,
            help=f"{side} CP ranks of their own, beside TP (default 1)",
        )
        context.add_argument(
            f"--{side}-dcp",
            type=_positive,
            default=1,
            help=f"{side} DCP ranks carved out of TP: TP rank r holds share r %% dcp (default 1)",
        )
    context.add_argument(
        "--interleave",
        type=_positive,
        default=1,
        help="tokens a block when dealing round-robin (vLLM's cp_kv_cache_interleave_size, "
        "default 1; the page size is block round-robin)",
    )
    context.add_argument(
        "--cp-split",
        choices=("interleave", "contiguous", "zigzag"),
        default="interleave",
        help="how CP ranks of their own deal the prompt (default interleave); DCP always "
        "interleaves",
    )
    context.add_argument(
        "--cp-kv",
        choices=("sharded", "replicated"),
        default="sharded",
        help="CP ranks hold disjoint shares (default) or every token (replicas to read from)",
    )
    model = parser.add_argument_group("model (one of --model, --config or the shape options)")
    model.add_argument(
        "--model",
        type=_model,
        metavar="NAME|config.json",
        help=f"a preset ({', '.join(MODEL_PRESETS)}) or a local config.json",
    )
    model.add_argument("--config", metavar="config.json", help="a local Hugging Face config")
    model.add_argument(
        "--family",
        metavar="NAME",
        help="read the config with this family's reader whatever its architecture says "
        "(`pdplan models` lists them)",
    )
    model.add_argument("--layers", type=_positive)
    model.add_argument("--kv-heads", type=_positive)
    model.add_argument("--head-dim", type=_positive)
    model.add_argument("--dtype", default="bfloat16", help="bfloat16, float16, float32, fp8")
    model.add_argument("--page-size", type=_positive, default=16, help="tokens a page (16)")
    model.add_argument(
        "--kv-cache-dtype",
        help="the KV cache's element type (default: the model's): fp8, float8_e5m2, nvfp4, ...",
    )
    model.add_argument(
        "--state-dtype",
        help="SSM and recurrent states' element type (default: the model's; vLLM's "
        "mamba_ssm_cache_dtype is often float32)",
    )
    model.add_argument(
        "--prefill-page-size",
        type=_positive,
        help="tokens a prefill page (default: --page-size); sides whose page sizes differ move "
        "by slot maps (token_maps)",
    )
    model.add_argument(
        "--decode-page-size", type=_positive, help="tokens a decode page (default: --page-size)"
    )
    cost = parser.add_argument_group(
        "staging cost model (defaults: GPU caches behind a 400 Gb/s NIC; see pdplan.CostModel)"
    )
    defaults = CostModel()
    figures = (
        ("--per-descriptor-us", _non_negative, defaults.per_descriptor_s * 1e6,
         "what the engine pays a descriptor, in µs"),
        ("--network-gbit", _positive_real, defaults.network_bytes_per_s * 8 / 1e9,
         "wire bandwidth, in Gb/s"),
        ("--copy-gbyte", _positive_real, defaults.copy_bytes_per_s / 1e9,
         "gather/scatter copy rate, in GB/s"),
        ("--per-copy-us", _non_negative, defaults.per_copy_s * 1e6,
         "fixed cost of one gather or scatter (a kernel launch), in µs"),
        ("--per-segment-ns", _non_negative, defaults.per_segment_s * 1e9,
         "cost of each gather/scatter segment, in ns"),
    )  # fmt: skip
    for flag, kind, default, text in figures:
        cost.add_argument(flag, type=kind, default=default, help=f"{text} (%(default)g)")
    cost.add_argument(
        "--chunk-bytes",
        type=_positive,
        default=None,
        help="split the staged transfer into chunks of this many bytes (default: one)",
    )
    pages = parser.add_argument_group("pages and receivers")
    pages.add_argument(
        "--kv-layout",
        choices=("HND", "NHD"),
        default="HND",
        help="KV page layout: HND head-major (default) or NHD token-major (a row per token)",
    )
    pages.add_argument(
        "--decode-replicas",
        choices=("first", "all"),
        default="first",
        help="which decode ranks of a replica group receive: first (default, as the "
        "reference) or all, directly",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pdplan",
        description="Plan prefill -> decode KV-cache transfers between two parallel layouts.",
    )
    parser.add_argument("--version", action="version", version=f"pdplan {_core.__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser(
        "demo",
        help="a Llama-3-70B-like model, prefill TP 8 -> decode TP 2, end to end",
        description="Plan a Llama-3-70B-like model from prefill TP 8 to decode TP 2: routing, "
        "fanout, bytes per rank per page, and the descriptors of a 32k-token request.",
    )
    plan = commands.add_parser(
        "plan",
        help="print the plan of every decode rank",
        description="Print every decode rank's plan, the fanout and the routing.",
    )
    _layout_options(plan)
    plan.add_argument(
        "--format",
        choices=("table", "json", "routing-json", "dot"),
        default="table",
        help="table (default); json: every fragment of every shown rank; routing-json: pairs, "
        "fragment counts, bytes per page and fanout only; dot: a Graphviz graph",
    )
    plan.add_argument(
        "--decode-rank",
        type=_rank,
        action="append",
        metavar="N",
        help="show only this decode rank (repeatable; default: every decode rank)",
    )
    check = commands.add_parser(
        "check",
        help="exit 0 when the layouts are supported, 2 with the reason when not",
        description="Exit 0 when supported; otherwise print why and what would work, exit 2.",
    )
    _layout_options(check)
    models = commands.add_parser(
        "models",
        help="list the model families whose configs pdplan reads",
        description="Every model family: the architectures and model types its reader covers, "
        "the cache-shaping config keys it reads, and the modeling code its rule follows.",
    )
    models.add_argument("--format", choices=("table", "json"), default="table")
    return parser


def _model(value: str) -> str:
    """A preset name or the path of a config file (read later, where errors are reported)."""
    if value in MODEL_PRESETS or value.endswith(".json") or Path(value).is_file():
        return value
    raise argparse.ArgumentTypeError(
        f"unknown model {value!r}: give a preset ({', '.join(MODEL_PRESETS)}) or a config.json"
    )


def _shape(args: argparse.Namespace) -> ModelShape:
    explicit = [args.layers, args.kv_heads, args.head_dim]
    chosen = sum(x is not None for x in (args.model, args.config)) + any(
        x is not None for x in explicit
    )
    if chosen != 1:
        raise UserError(
            "give exactly one model: --model PRESET, --config config.json, or "
            "--layers N --kv-heads N --head-dim N [--dtype NAME]"
        )
    if args.family is not None and not (args.config or args.model not in (None, *MODEL_PRESETS)):
        raise UserError("--family chooses the reader of a config.json; give one with --config")
    if args.model in MODEL_PRESETS:
        shape = ModelShape.preset(args.model, page_size=args.page_size)
    elif args.model or args.config:
        path = args.model or args.config
        shape = ModelShape.from_hf_config(path, page_size=args.page_size, family=args.family)
    elif any(x is None for x in explicit):
        raise UserError("--layers, --kv-heads and --head-dim go together")
    else:
        _core.dtype_bytes(args.dtype)  # refuse unknown names with the known ones listed
        shape = ModelShape(args.layers, args.kv_heads, args.head_dim, args.dtype, args.page_size)
    # The config's dtypes stand unless the command names others.
    return replace(
        shape,
        kv_cache_dtype=args.kv_cache_dtype or shape.kv_cache_dtype,
        state_dtype=args.state_dtype or shape.state_dtype,
    )


def _model_name(args: argparse.Namespace) -> str | None:
    """What the model line calls the model: the preset, or the folder its config is in."""
    if args.model in MODEL_PRESETS:
        return str(args.model)
    path = args.model or args.config
    if path is None:
        return None
    folder = Path(path).resolve().parent.name
    return folder or Path(path).name


def _layer_ranges(summary: LayerKindSummary, most: int = 6) -> str:
    """Where a kind's layers are, the first few ranges of them when there are many."""
    ranges = summary.where().split(", ")
    if len(ranges) <= most:
        return ", ".join(ranges)
    return ", ".join(ranges[:most]) + f", ... {summary.layers[-1]}"


def _model_lines(
    shape: ModelShape, name: str | None = None, tokens: int = REQUEST_TOKENS
) -> list[str]:
    """The model (its name and the family that read it), per layer kind (what each keeps, and
    where), and the KV bytes one request of `tokens` tokens keeps with and without its
    sliding windows and attention chunks."""
    kv = shape.kv_cache_dtype or shape.dtype
    state = shape.state_dtype or shape.dtype
    named = " ".join(
        part
        for part in (name, f"(family {shape.family})" if shape.family else None)
        if part is not None
    )
    lines = [
        f"model: {named + ': ' if named else ''}{shape.num_layers} layers ({shape.dtype}; "
        f"KV cache {kv}, states {state})"
    ]
    whole = windowed = 0
    selections = set()
    for kind in shape.summary():
        keeps = []
        if kind.token_bytes:
            keeps.append(f"{kind.token_bytes:,} B a token")
        if kind.state_bytes:
            keeps.append(f"{kind.state_bytes:,} B of state a request")
        what = "; ".join(keeps) or "no cache"
        lines.append(
            f"  {len(kind.layers):>4} x {kind.label}: {what}; layers {_layer_ranges(kind)}"
        )
        whole += kind.token_bytes * len(kind.layers) * tokens
        windowed += kind.token_bytes * len(kind.layers) * kind.kept_tokens(tokens)
        if kind.sliding_window is not None:
            selections.add("sliding windows")
        if kind.attention_chunk_size is not None:
            selections.add("attention chunks")
    if windowed != whole:
        lines.append(
            f"a {tokens // 1024}k-token request's KV: {windowed / 2**30:.2f} GiB moved with "
            f"{' and '.join(sorted(selections, reverse=True))}, {whole / 2**30:.2f} GiB without"
        )
    return lines


def _print_families(output_format: str) -> None:
    """The registry, one family a paragraph (or as JSON)."""
    families = model_families()
    if output_format == "json":
        json.dump([asdict(f) for f in families], sys.stdout, indent=2)
        print()
        return
    for family in families:
        print(f"{family.name}: {', '.join(family.architectures)}")
        print(f"  model types: {', '.join(family.model_types)}")
        print(f"  cache keys read: {', '.join(family.keys)}")
        print(f"  rule: {family.source}")


@dataclass(frozen=True)
class Deployment:
    """Both sides as the command line describes them."""

    prefill_tp: int
    decode_tp: int
    prefill_dp: int = 1
    decode_dp: int = 1
    kv_layout: Literal["HND", "NHD"] = "HND"
    decode_replicas: Literal["first", "all"] = "first"
    prefill_pp: int = 1
    decode_pp: int = 1
    prefill_partition: tuple[int, ...] | None = None
    decode_partition: tuple[int, ...] | None = None
    #: Tokens a page on each side; None: the model's page size.
    prefill_page_size: int | None = None
    decode_page_size: int | None = None
    #: Context parallelism: CP ranks of their own and DCP ranks inside TP, each side.
    prefill_cp: int = 1
    decode_cp: int = 1
    prefill_dcp: int = 1
    decode_dcp: int = 1
    interleave: int = 1
    cp_split: Literal["interleave", "contiguous", "zigzag"] = "interleave"
    cp_kv: Literal["sharded", "replicated"] = "sharded"

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Deployment:
        return cls(
            args.prefill_tp,
            args.decode_tp,
            args.prefill_dp,
            args.decode_dp,
            args.kv_layout,
            args.decode_replicas,
            args.prefill_pp,
            args.decode_pp,
            args.prefill_pp_partition,
            args.decode_pp_partition,
            args.prefill_page_size,
            args.decode_page_size,
            args.prefill_cp,
            args.decode_cp,
            args.prefill_dcp,
            args.decode_dcp,
            args.interleave,
            args.cp_split,
            args.cp_kv,
        )

    def layout(
        self, role: Literal["prefill", "decode"], partition: tuple[int, ...] | None
    ) -> ParallelLayout:
        """One side's layout: CP ranks deal by --cp-split, DCP ranks always interleave."""
        tp, dp, pp, cp, dcp = (
            (self.prefill_tp, self.prefill_dp, self.prefill_pp, self.prefill_cp, self.prefill_dcp)
            if role == "prefill"
            else (self.decode_tp, self.decode_dp, self.decode_pp, self.decode_cp, self.decode_dcp)
        )
        return ParallelLayout(
            role,
            tp * dp * pp * cp,
            dp,
            pp,
            partition,
            cp_size=cp,
            dcp_size=dcp,
            cp_kv=self.cp_kv if cp > 1 else "sharded",
            cp_split=self.cp_split if cp > 1 else "interleave",
            cp_interleave=self.interleave,
        )

    def planner(self, shape: ModelShape) -> PDTransferPlanner:
        def partition(pp: int, given: tuple[int, ...] | None) -> tuple[int, ...] | None:
            # Stages split the model's layers, MLP-only ones too (the buffers name only the
            # layers with a cache): pdplan's default split of all of them.
            if given is not None or pp == 1:
                return given
            return even_layer_partition(shape.num_layers, pp)

        def buffers(page_size: int | None) -> tuple[tuple[BufferLayout, ...], ...]:
            sized = shape if page_size is None else replace(shape, page_size=page_size)
            return model_buffer_layouts(
                sized,
                self.prefill_tp,
                self.decode_tp,
                self.kv_layout,
                prefill_pp=self.prefill_pp,
                decode_pp=self.decode_pp,
                prefill_cp=self.prefill_cp,
                decode_cp=self.decode_cp,
                prefill_dcp=self.prefill_dcp,
                decode_dcp=self.decode_dcp,
            )

        # Each side's buffers in its own page size (a planner maps tokens where they differ).
        prefill_buffers = buffers(self.prefill_page_size)[0]
        decode_buffers = buffers(self.decode_page_size)[1]
        return PDTransferPlanner(
            prefill_layout=self.layout(
                "prefill", partition(self.prefill_pp, self.prefill_partition)
            ),
            decode_layout=self.layout("decode", partition(self.decode_pp, self.decode_partition)),
            prefill_buffers=prefill_buffers,
            decode_buffers=decode_buffers,
            decode_replicas=self.decode_replicas,
        )


def _planner_from_args(args: argparse.Namespace) -> tuple[ModelShape, PDTransferPlanner]:
    shape = _shape(args)
    return shape, Deployment.from_args(args).planner(shape)


def _idle_note(planner: PDTransferPlanner) -> str:
    """What the runtime must do for decode ranks that receive nothing (empty when none)."""
    idle = planner.idle_decode_ranks
    if not idle:
        return ""
    return (
        f"{idle} of {planner.decode_layout.world_size} decode ranks receive nothing "
        "(decode TP is above the KV-head count and only the first rank of each replica group "
        "receives): the runtime must copy inside each group after the transfer, or plan with "
        "--decode-replicas all"
    )


def _chosen_ranks(args: argparse.Namespace, planner: PDTransferPlanner) -> list[int]:
    """The decode ranks to show: those asked for (in order, once each), else all."""
    world = planner.decode_layout.world_size
    if not args.decode_rank:
        return list(range(world))
    for rank in args.decode_rank:
        try:
            planner.decode_layout.rank_coordinates(rank)
        except UnsupportedPDLayoutError as error:
            raise UserError(f"--decode-rank: {error}") from None
    return list(dict.fromkeys(args.decode_rank))


def _header(shape: ModelShape, planner: PDTransferPlanner) -> str:
    """The JSON members both formats start with, as text to stream."""
    head = {
        "prefill": asdict(planner.prefill_layout),
        "decode": asdict(planner.decode_layout),
        "model": shape.to_dict(),
        "buffers": len(planner.prefill_buffers),
    }
    return json.dumps(head)[:-1]


def _write_plan_json(
    out: TextIO, shape: ModelShape, planner: PDTransferPlanner, ranks: Sequence[int]
) -> None:
    """Every fragment of the chosen ranks, streamed rank by rank: each rank's fragments are
    written by the wire encoder in Rust (the same keys, in field order), never held at once."""
    out.write(_header(shape, planner) + ',\n"plans": [')
    for position, rank in enumerate(ranks):
        plan = planner.plan_for_decode_rank(rank)
        entry = {
            "decode_rank": rank,
            "plan_kind": plan.plan_kind,
            "target_dp_group": plan.target_dp_group,
            "target_prefill_ranks": list(plan.target_prefill_ranks),
            "required_dst_info_num_by_prefill_rank": {
                str(r): n for r, n in plan.required_dst_info_num_by_prefill_rank.items()
            },
        }
        out.write(("," if position else "") + "\n" + json.dumps(entry)[:-1] + ', "fragments": {')
        for index, (source, fragments) in enumerate(plan.fragments_by_prefill_rank.items()):
            payload = encode_transfer_fragments(fragments)[1].decode("ascii")
            out.write(f'{", " if index else ""}"{source}": {payload}')
        out.write("}}")
    fanout = {str(r): n for r, n in planner.source_fanout.items()}
    out.write('\n],\n"source_fanout": ' + json.dumps(fanout) + "}\n")


def _write_routing_json(
    out: TextIO, shape: ModelShape, planner: PDTransferPlanner, ranks: Sequence[int]
) -> None:
    """Who talks to whom: one row per (decode rank, prefill rank) pair (notify-only pairs have
    0 fragments and 0 bytes), and the fanout."""
    pairs = [
        {"decode_rank": d, "prefill_rank": p, "fragments": n, "bytes_per_page": b}
        for d, p, n, b in _routing_rows(planner, ranks)
    ]
    out.write(_header(shape, planner) + ',\n"pairs": [')
    out.write(",\n".join(json.dumps(pair) for pair in pairs))
    fanout = {str(r): n for r, n in planner.source_fanout.items()}
    out.write('],\n"source_fanout": ' + json.dumps(fanout) + "}\n")


def _routing_rows(
    planner: PDTransferPlanner, ranks: Sequence[int] | None = None
) -> list[tuple[int, int, int, int]]:
    table = planner.routing_table()
    rows = zip(
        table.decode_rank.tolist(),
        table.prefill_rank.tolist(),
        table.fragment_count.tolist(),
        table.bytes_per_page.tolist(),
    )
    if ranks is None:
        return list(rows)
    by_rank: dict[int, list[tuple[int, int, int, int]]] = {rank: [] for rank in ranks}
    for row in rows:
        if row[0] in by_rank:
            by_rank[row[0]].append(row)
    return [row for rank in ranks for row in by_rank[rank]]


def _print_table(
    shape: ModelShape,
    planner: PDTransferPlanner,
    model: CostModel,
    chunk_bytes: int | None,
    ranks: Sequence[int] | None = None,
    name: str | None = None,
) -> None:
    p, d = planner.prefill_layout, planner.decode_layout

    def sizes(layout: ParallelLayout) -> str:
        stages = f" x PP {layout.pp_size}" if layout.pp_size > 1 else ""
        cp = f" x CP {layout.cp_size}" if layout.cp_size > 1 else ""
        dcp = f" (DCP {layout.dcp_size})" if layout.dcp_size > 1 else ""
        return f"{layout.dp_size} DP{stages}{cp} x TP {layout.tp_size_per_dp}{dcp}"

    pages = page_sizes(planner)
    if pages[0] == pages[1]:
        page_text = f"{pages[0]}-token pages"
    else:
        page_text = f"{pages[0]}-token prefill pages, {pages[1]}-token decode pages (token maps)"
    for line in _model_lines(shape, name):
        print(line)
    print(
        f"prefill {p.world_size} ranks ({sizes(p)}) -> decode {d.world_size} ranks "
        f"({sizes(d)}); {len(planner.prefill_buffers)} buffers, {page_text}"
    )
    kind = planner.plan_for_decode_rank(0).plan_kind
    print(f"plan kind: {kind}" + (" (whole items, rank to rank)" if kind == "identity" else ""))
    if note := _idle_note(planner):
        print(f"note: {note}")
    if line := _context_line(planner):
        print(line)
    for line in _request_lines(planner, model, chunk_bytes):
        print(line)
    print()
    staged = planner.is_staged

    def rank(layout: ParallelLayout, number: int) -> str:
        """A rank, with its pipeline stage when stages are in play."""
        if not staged:
            return str(number)
        return f"{number} (stage {layout.rank_coordinates(number).stage})"

    width = 18 if staged else 12
    print(
        f"{'decode rank':>{width}}  {'prefill rank':>{width}}  {'fragments':>9}  {'bytes/page':>12}"
    )
    for decode_rank, prefill_rank, count, nbytes in _routing_rows(planner, ranks):
        moved = f"{count:>9}  {nbytes:>12,}" if count else f"{'notify':>9}  {'':>12}"
        print(f"{rank(d, decode_rank):>{width}}  {rank(p, prefill_rank):>{width}}  {moved}")
    print()
    fanout = planner.source_fanout
    print("fanout (decode ranks each prefill rank waits for, per request):")
    print("  " + ", ".join(f"{rank}: {n}" for rank, n in fanout.items()))


def _seconds(value: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value * 1e6:.3g} µs"


def _request_lines(
    planner: PDTransferPlanner, model: CostModel, chunk_bytes: int | None = None
) -> list[str]:
    """The request line, then each group of alike rank pairs with the cost model's choice."""
    pairs = list(request_pairs(planner, REQUEST_TOKENS, model, chunk_bytes))
    total = sum(p.descriptors for p in pairs)
    total_bytes = sum(p.bytes for p in pairs)
    way = "slot maps" if planner.token_maps else "pages"
    each = f", {total_bytes // total:,} B a descriptor" if total else ""
    lines = [
        f"a {REQUEST_TOKENS // 1024}k-token request to decode DP group 0 (scattered pages, by "
        f"{way}): {total:,} descriptors moving {total_bytes / 2**30:.2f} GiB over {len(pairs)} "
        f"rank pairs{each}"
    ]
    if not pairs:
        return lines
    lines.append(
        f"staging it, per rank pair (cost model: {model.per_descriptor_s * 1e6:g} µs a "
        f"descriptor, {model.network_bytes_per_s * 8 / 1e9:g} Gb/s wire, copies at "
        f"{model.copy_bytes_per_s / 1e9:g} GB/s + {model.per_copy_s * 1e6:g} µs; --help lists "
        "the flags):"
    )
    groups: dict[tuple[int, int, int, str], list[PairRequest]] = {}
    for p in pairs:
        e = p.estimate
        groups.setdefault((p.descriptors, p.bytes, e.wire_descriptors, e.choice), []).append(p)
    for (count, nbytes, transfers, choice), members in groups.items():
        e = members[0].estimate
        named = ", ".join(f"{m.decode_rank}<-{m.prefill_rank}" for m in members[:4])
        more = f" and {len(members) - 4} more" if len(members) > 4 else ""
        size = f"{nbytes // count:,} B" if count else "0 B"
        lines.append(
            f"  decode<-prefill {named}{more} ({len(members)} pairs): {count:,} descriptors of "
            f"{size}; direct {_seconds(e.direct_s)}, staged {_seconds(e.staging_s)} in "
            f"{transfers:,} descriptor(s) -> {choice}"
        )
    return lines


def _context_line(planner: PDTransferPlanner) -> str:
    """How the sides spread tokens and what that costs a decode rank (empty without CP)."""

    def spread(layout: ParallelLayout) -> str | None:
        if layout.dcp_size > 1:
            return f"DCP {layout.dcp_size} (interleave {layout.cp_interleave})"
        if layout.cp_size > 1:
            how: str = "replicas" if layout.cp_kv == "replicated" else layout.cp_split
            if how == "interleave":
                how = f"interleave {layout.cp_interleave}"
            return f"CP {layout.cp_size} ({how})"
        return None

    sides = [spread(planner.prefill_layout), spread(planner.decode_layout)]
    if sides == [None, None]:
        return ""
    plan = planner.plan_for_decode_rank(0, num_tokens=REQUEST_TOKENS)
    fanout = max(plan.required_dst_info_num_by_prefill_rank.values(), default=0)
    return (
        f"context parallelism: prefill {sides[0] or 'none'}, decode {sides[1] or 'none'}; for a "
        f"{REQUEST_TOKENS // 1024}k-token request decode rank 0 reads from "
        f"{plan.required_prefill_response_num} prefill rank(s) (largest fanout {fanout})"
    )


def _print_dot(planner: PDTransferPlanner, ranks: Sequence[int]) -> None:
    rows = _routing_rows(planner, ranks)
    print("digraph pdplan {")
    print("  rankdir=LR;")
    for rank in sorted({row[1] for row in rows}):
        print(f'  "P{rank}" [shape=box, label="prefill {rank}"];')
    for rank in ranks:
        print(f'  "D{rank}" [shape=ellipse, label="decode {rank}"];')
    for decode_rank, prefill_rank, count, nbytes in rows:
        if count == 0:  # the prefill rank sends nothing but must hear "done"
            print(f'  "P{prefill_rank}" -> "D{decode_rank}" [label="notify", style=dashed];')
            continue
        print(
            f'  "P{prefill_rank}" -> "D{decode_rank}" [label="{nbytes} B/page, {count} fragments"];'
        )
    print("}")


def _suggestion(args: argparse.Namespace, shape: ModelShape) -> str:
    """What would work with the rest as given: DCP sizes when context parallelism is in play,
    else TP sizes."""
    deployment = Deployment.from_args(args)

    def works(**changed: int) -> bool:
        try:
            replace(deployment, **changed).planner(shape)  # type: ignore[arg-type]
        except UnsupportedPDLayoutError:
            return False
        return True

    parts = []
    spread = ("prefill_cp", "decode_cp", "prefill_dcp", "decode_dcp")
    if any(getattr(args, name) > 1 for name in spread):
        for side in ("decode", "prefill"):
            tp = getattr(args, f"{side}_tp")
            if getattr(args, f"{side}_dcp") > 1:
                divisors = [n for n in range(2, tp + 1) if tp % n == 0]
                dcp = [n for n in divisors if works(**{f"{side}_dcp": n})]
                if dcp:
                    parts.append(f"{side} DCP {', '.join(map(str, dcp))}")
        if not parts and works(**dict.fromkeys(spread, 1)):
            parts.append("the same TP sizes without context parallelism")
        return "; would work: " + " or ".join(parts) if parts else ""
    sizes = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
    decode = [n for n in sizes if works(decode_tp=n)]
    prefill = [n for n in sizes if works(prefill_tp=n)]
    if decode:
        parts.append(f"decode TP {', '.join(map(str, decode))} with prefill TP {args.prefill_tp}")
    if prefill:
        parts.append(f"prefill TP {', '.join(map(str, prefill))} with decode TP {args.decode_tp}")
    return "; would work: " + " or ".join(parts) if parts else ""


def _demo() -> None:
    shape = ModelShape.preset(DEMO_MODEL)
    planner = Deployment(prefill_tp=8, decode_tp=2).planner(shape)
    print(f"pdplan {_core.__version__} demo: {DEMO_MODEL}")
    _print_table(shape, planner, CostModel(), None)
    tokens = 32768
    pages = tokens // shape.page_size
    print()
    print(
        f"a {tokens // 1024}k-token request ({pages} pages), descriptors built per "
        f"(decode rank, prefill rank) pair:"
    )
    import numpy as np

    src_pages = np.arange(pages, dtype=np.int32)
    dst_pages = np.arange(pages, dtype=np.int32)
    src_limits = [b.item_stride_bytes * pages for b in planner.prefill_buffers]
    dst_limits = [b.item_stride_bytes * pages for b in planner.decode_buffers]
    bases = [1 << 40] * len(src_limits)
    pairs = [
        fragments
        for decode_rank in range(planner.decode_layout.world_size)
        for fragments in planner.transfer_fragments(decode_rank).values()
    ]

    def build_all() -> tuple[int, int]:
        total = total_bytes = 0
        for fragments in pairs:
            d = transfer_descriptors(
                fragments,
                bases,
                bases,
                src_pages,
                dst_pages,
                src_limits=src_limits,
                dst_limits=dst_limits,
            )
            total += d.num_descriptors
            total_bytes += d.total_bytes
        return total, total_bytes

    # Timed as the README's figures are: warm, the best of a few runs (the first call also
    # pays for faulting the arrays' pages in).
    times = []
    for _ in range(DEMO_RUNS):
        started = time.perf_counter()
        total, total_bytes = build_all()
        times.append(time.perf_counter() - started)
    best = min(times[1:])
    print(
        f"  {total:,} descriptors moving {total_bytes / 2**30:.2f} GiB in {len(pairs)} calls: "
        f"{best * 1e3:.1f} ms warm, best of {DEMO_RUNS - 1} ({total / best / 1e6:.0f} M "
        f"descriptors/s; the first, cold run took {times[0] * 1e3:.1f} ms)"
    )
    print(
        "  benches/compare.py times this beside numpy and the plain Python loop "
        "(see README, Per-request descriptors)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            _demo()
            return 0
        if args.command == "models":
            _print_families(args.format)
            return 0
        if args.command == "check":
            try:
                shape, planner = _planner_from_args(args)
                planner.verify()
            except UnsupportedPDLayoutError as exc:
                shape = _shape(args)
                print(f"unsupported: {exc}{_suggestion(args, shape)}", file=sys.stderr)
                return EXIT_UNSUPPORTED
            for line in _model_lines(shape, _model_name(args)):
                print(line)
            kind = planner.plan_for_decode_rank(0).plan_kind
            print(f"supported: {kind} plan, {len(planner.prefill_buffers)} buffers, verified")
            if line := _context_line(planner):
                print(line)
            for line in _request_lines(planner, _cost_model(args), args.chunk_bytes):
                print(line)
            if note := _idle_note(planner):
                print(f"note: {note}")
            return 0
        shape, planner = _planner_from_args(args)
        ranks = _chosen_ranks(args, planner)
        if args.format == "json":
            _write_plan_json(sys.stdout, shape, planner, ranks)
        elif args.format == "routing-json":
            _write_routing_json(sys.stdout, shape, planner, ranks)
        elif args.format == "dot":
            _print_dot(planner, ranks)
        else:
            _print_table(
                shape,
                planner,
                _cost_model(args),
                args.chunk_bytes,
                ranks if args.decode_rank else None,
                _model_name(args),
            )
        return 0
    except (UserError, UnsupportedPDLayoutError) as exc:
        print(f"pdplan: {exc}", file=sys.stderr)
        return EXIT_UNSUPPORTED
    except BrokenPipeError:  # `pdplan plan ... | head`
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
