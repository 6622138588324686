"""One vLLM instance's ranks as the connector sees them: the TP ranks of each pipeline stage of
one DP rank, its side-channel ports, and the layout each side plans with. DP ranks of one
instance on one host each take their own ports: DP rank ``d``'s rank ``r`` listens on
``side_channel_port + d * tp * pp + r`` (NixlConnector adds the DP index likewise)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pdplan._model import ParallelLayout
from pdplan.connectors.vllm._stages import layer_partition, side_layout
from pdplan.session import SettingsFault


@dataclass(frozen=True)
class Ranks:
    """An instance's ranks of one DP rank: ``tp_size`` TP ranks in each of ``pp_size`` pipeline
    stages, each stage holding ``partition[s]`` of the model's layers."""

    tp_size: int
    pp_size: int
    dp_index: int
    partition: tuple[int, ...]

    @classmethod
    def of(cls, vllm_config: Any) -> Ranks:
        """The instance's ranks, from vLLM's config; a layout the connector does not read is
        refused when the instance starts, naming it."""
        parallel = vllm_config.parallel_config
        dcp = int(getattr(parallel, "decode_context_parallel_size", 1) or 1)
        if dcp > 1:
            raise SettingsFault(
                f"decode_context_parallel_size={dcp}: PdplanConnector serves instances whose "
                "ranks hold whole requests (TP and pipeline stages); serve without decode "
                "context parallelism"
            )
        pp = int(parallel.pipeline_parallel_size)
        partition: tuple[int, ...] = ()
        if pp > 1:
            config = vllm_config.model_config.hf_config
            text = getattr(config, "get_text_config", lambda: config)()
            partition = layer_partition(int(text.num_hidden_layers), pp)
        index = getattr(parallel, "data_parallel_index", None)
        if index is None:
            index = getattr(parallel, "data_parallel_rank", 0)
        return cls(int(parallel.tensor_parallel_size), pp, int(index or 0), partition)

    @property
    def ranks(self) -> int:
        """Ranks of one DP rank: TP ranks of every stage."""
        return self.tp_size * self.pp_size

    def base_port(self, side_channel_port: int) -> int:
        """The side-channel port of this DP rank's rank 0 (rank ``r`` listens on it plus
        ``r``)."""
        return side_channel_port + self.dp_index * self.ranks

    def rank(self, tp_rank: int, pp_rank: int) -> int:
        """A worker's rank among the DP rank's: TP fastest, then stage (vLLM's order)."""
        return pp_rank * self.tp_size + tp_rank

    def layout(self, role: str) -> ParallelLayout | None:
        """The layout a side plans with where it has stages (None: TP ranks alone)."""
        if self.pp_size == 1:
            return None
        layout: ParallelLayout = side_layout(role, self.tp_size, self.pp_size, self.partition)
        return layout
