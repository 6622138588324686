"""The connector's NIXL agent: its progress thread paced by ``nixl_progress_delay_us``. NIXL's
Python ``nixl_agent`` builds its bound agent's config itself with ``pthrDelay = 0``; pdplan
sets the delay on that config for one construction and leaves the module as it found it."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from pdplan._core import UnsupportedPDLayoutError
from pdplan.session._engines import _paced_agent
from pdplan.session._settings import Settings


class FakeNixl:
    """The shape of ``nixl._api``: ``nixl_agent`` makes a config with ``pthrDelay = 0`` and
    passes it to ``nixlBind.nixlAgent``, as NIXL 1.5.1's wrapper does."""

    def __init__(self) -> None:
        self.seen: list[int] = []
        self.nixlBind = SimpleNamespace(nixlAgent=self._bound)
        self._original = self.nixlBind.nixlAgent

    def _bound(self, name: str, config: Any) -> str:
        self.seen.append(config.pthrDelay)
        return name

    def nixl_agent_config(self, backends: list[str]) -> Any:
        return SimpleNamespace(backends=backends)

    def nixl_agent(self, name: str, conf: Any) -> str:
        config = SimpleNamespace(pthrDelay=0)
        return str(self.nixlBind.nixlAgent(name, config))


@pytest.mark.parametrize("delay", [0, 10, 250])
def test_the_agent_is_built_with_the_delay_and_nixl_is_left_as_it_was(delay: int) -> None:
    api = FakeNixl()
    assert _paced_agent(api, "decode-0", delay) == "decode-0"
    assert api.seen == [delay]
    assert api.nixlBind.nixlAgent == api._original
    api.nixl_agent("other", None)  # later agents, pdplan's or not, get NIXL's own default
    assert api.seen == [delay, 0]


def test_agents_built_at_once_each_get_their_delay() -> None:
    api = FakeNixl()
    threads = [threading.Thread(target=_paced_agent, args=(api, f"a{i}", 10 + i)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(api.seen) == [10 + i for i in range(8)]
    assert api.nixlBind.nixlAgent == api._original


def test_the_delay_setting_is_bounded() -> None:
    assert Settings.of({}).nixl_progress_delay_us == 10
    assert Settings.of({"nixl_progress_delay_us": 0}).nixl_progress_delay_us == 0
    for bad in (-1, 2_000_000, 1.5, True):
        with pytest.raises(UnsupportedPDLayoutError, match="nixl_progress_delay_us"):
            Settings.of({"nixl_progress_delay_us": bad})


def test_the_descriptor_form_is_one_of_three_and_strided_needs_nixl() -> None:
    assert Settings.of({}).descriptors == "auto"
    assert Settings.of({"descriptors": "flat"}).descriptors == "flat"
    for bad in ("rows", 1, None):
        with pytest.raises(UnsupportedPDLayoutError, match="descriptors"):
            Settings.of({"descriptors": bad})
    with pytest.raises(UnsupportedPDLayoutError, match="Mooncake reads flat"):
        Settings.of({"descriptors": "strided", "engine": "mooncake"})


def test_the_engine_s_posting_costs_are_settings_of_the_cost_model() -> None:
    from pdplan import CostModel

    default, plain = Settings.of({}).cost_model(), CostModel()
    figures = ("per_descriptor_s", "per_row_s", "per_block_s", "network_bytes_per_s")
    assert [getattr(default, f) for f in figures] == pytest.approx(
        [getattr(plain, f) for f in figures], rel=1e-12
    )
    calibrated = Settings.of({"per_descriptor_us": 2, "per_row_us": 0.05, "per_block_us": 1.5})
    m = calibrated.cost_model()
    assert (m.per_descriptor_s, m.per_row_s, m.per_block_s) == pytest.approx((2e-6, 5e-8, 1.5e-6))
    assert m.network_bytes_per_s == CostModel().network_bytes_per_s
    # At these figures a row of ten blocks (0.05 + 15 µs) beats ten descriptors (20 µs).
    assert m.choose_form_counts((10, 0, 0, 0, 640), strided=(1, 10), staging=False).form == (
        "strided"
    )
    for bad in ({"per_row_us": -1.0}, {"per_block_us": float("nan")}, {"per_row_us": "1"}):
        with pytest.raises(UnsupportedPDLayoutError):
            Settings.of(bad)
