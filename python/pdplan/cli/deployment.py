"""Both sides as the command line describes them, and the model they serve."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Literal

from pdplan._layouts import (
    MODEL_PRESETS,
    ModelShape,
    even_layer_partition,
    model_buffer_layouts,
)
from pdplan._model import BufferLayout, ParallelLayout
from pdplan._planner import PDTransferPlanner
from pdplan.cli.arguments import UserError


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
        """The deployment the flags describe: each field from the flag of its name (the
        partitions from ``--prefill-pp-partition`` and ``--decode-pp-partition``)."""
        flags = {
            "prefill_partition": "prefill_pp_partition",
            "decode_partition": "decode_pp_partition",
        }
        return cls(**{f.name: getattr(args, flags.get(f.name, f.name)) for f in fields(cls)})

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


def shape_of(args: argparse.Namespace) -> ModelShape:
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
        shape = ModelShape(args.layers, args.kv_heads, args.head_dim, args.dtype, args.page_size)
    # The config's dtypes stand unless the command names others.
    return replace(
        shape,
        kv_cache_dtype=args.kv_cache_dtype or shape.kv_cache_dtype,
        state_dtype=args.state_dtype or shape.state_dtype,
    )


def model_name(args: argparse.Namespace) -> str | None:
    """What the model line calls the model: the preset, or the folder its config is in."""
    if args.model in MODEL_PRESETS:
        return str(args.model)
    path = args.model or args.config
    if path is None:
        return None
    folder = Path(path).resolve().parent.name
    return folder or Path(path).name


def planner_from_args(args: argparse.Namespace) -> tuple[ModelShape, PDTransferPlanner]:
    shape = shape_of(args)
    return shape, Deployment.from_args(args).planner(shape)
