"""``bench/layer_cost.py --host-only`` refuses values it cannot time, before touching a GPU."""

from __future__ import annotations

import pytest

from bench import layer_cost


@pytest.mark.parametrize("flags", [["--slots", "1"], ["--tokens", "0"], ["--rounds", "0"], ["--policy", "fastest"]])
def test_host_only_refuses_bad_values_with_their_name(flags: list[str], monkeypatch, capsys) -> None:
    monkeypatch.setattr("sys.argv", ["layer_cost.py", "--host-only", *flags])
    with pytest.raises(SystemExit) as exit_info:
        layer_cost.main()
    assert exit_info.value.code == 2 and flags[0] in capsys.readouterr().err
