"""The steady window: chosen from settling curves so its figure moves by less than 3% when
doubled, and each run's window judged steady or not by its trend (each way)."""

from pathlib import Path

import numpy as np
import pytest

from harness.analysis import steady


def test_window_rate_and_its_change_when_doubled():
    wall = [5.0, 1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0]
    assert steady.window_rate(wall, 1, 4) == 4 / 4.0
    assert steady.window_rate(wall, 1, 8) == 8 / 12.0
    assert abs(steady.doubling_change(wall, 1, 4) - (1 - (8 / 12.0))) < 1e-12
    assert np.isnan(steady.window_rate(wall, 5, 8))  # past the run's tokens


def test_the_window_chosen_is_past_the_settling_and_long_enough():
    rng = np.random.default_rng(3)
    # a configuration that settles after 10 tokens (slow, then flat with 1% noise), and one flat
    settling = [np.r_[np.linspace(3.0, 1.0, 10), 1.0 + 0.01 * rng.standard_normal(86)]
                for _ in range(2)]
    flat = [2.0 + 0.02 * rng.standard_normal(96) for _ in range(2)]
    window, table = steady.choose_window({"settles": settling, "flat": flat}, 96)
    assert window is not None and window.warmup >= 8
    for runs in (settling, flat):
        for r in runs:
            assert steady.doubling_change(r, window.warmup, window.length) < 0.03
    # tokens whose times vary a lot with what they route need a long window, and a short run
    # has none
    rough = [1.0 + 0.3 * np.sign(np.sin(np.arange(96) * 2.1)) * rng.random(96) for _ in range(2)]
    long_window, _ = steady.choose_window({"rough": rough}, 96)
    flat_window, _ = steady.choose_window({"flat": flat}, 96)
    assert long_window is not None and long_window.length > 2 * flat_window.length
    assert steady.choose_window({"rough": [r[:30] for r in rough]}, 30)[0] is None
    assert len(table) > 100


def test_a_drifting_window_is_not_steady_and_a_flat_one_is():
    rng = np.random.default_rng(1)
    flat = 1.0 + 0.05 * rng.standard_normal(24)
    rising = np.linspace(1.0, 1.6, 24) + 0.02 * rng.standard_normal(24)
    assert steady.drift(flat).steady and steady.drift(flat).why == ""
    d = steady.drift(rising)
    assert not d.steady and d.change > 0.4 and "drifts" in d.why
    # beyond the bound but noisy: its interval reaches below the bound, so it is not called a trend
    noisy = steady.drift([1.0, 1.9, 0.6, 2.2, 0.9, 1.6])
    assert noisy.change > steady.DRIFT_BOUND and noisy.low < 0 < noisy.high and noisy.steady
    assert steady.drift([1.0, 2.0]).steady  # too few tokens to judge
    # a clear trend whose interval still reaches inside the bound: not surely beyond it
    mild = np.linspace(1.0, 1.2, 24) + 0.05 * rng.standard_normal(24)
    m = steady.drift(mild)
    assert m.change > steady.DRIFT_BOUND and m.low < steady.DRIFT_BOUND and m.steady


def test_the_drift_divides_out_the_bytes_a_token_reads():
    rng = np.random.default_rng(2)
    # the tokens' routing reads more as the window goes on, and each byte costs the same: the
    # time rises with the content, not with the machine
    read = np.linspace(150e6, 300e6, 32) * (1 + 0.05 * rng.random(32))
    wall = read / 150e6
    assert not steady.drift(wall).steady
    d = steady.drift(wall, read_bytes=read)
    assert d.steady and d.per_byte and abs(d.change) < 0.01
    # the same bytes, each costing more as the window goes on: a drift per byte
    slower = wall * np.linspace(1.0, 1.5, 32)
    s = steady.drift(slower, read_bytes=read)
    assert not s.steady and "per byte" in s.why
    # a token that read nothing (cached): judged on its time instead
    assert not steady.drift(wall, read_bytes=np.r_[0.0, read[1:]]).per_byte


def test_a_run_whose_window_drifts_is_flagged_and_a_steady_one_is_not():
    import pandas as pd

    from harness.analysis import flags

    runs = pd.DataFrame({"window_steady": [True, False, "False", "True"]})  # as read from a CSV
    reasons = list(flags.flag_reason(runs))
    assert reasons[0] == "" and reasons[3] == ""
    assert all("window not steady" in r for r in (reasons[1], reasons[2]))


def test_the_window_columns_of_a_run_come_from_its_own_warmup():
    import pandas as pd

    from harness.analysis import window

    gen = pd.DataFrame({"wall_s": [9.0, 2.0, 2.0] + [1.0] * 8,
                        "cgroup_read_bytes": [0, 5, 5] + [3] * 8})
    assert window.steady_rate(gen, 3) == 1.0 and window.steady_rate(gen, 1) == 10 / 12.0
    assert window.warmup_rate(gen, 3) == 2 / 4.0  # tokens 2 and 3: the first is left out
    d = window.window_drift(gen, 3)
    assert d.steady and abs(d.change) < 1e-9
    assert window.window_read(gen, 3) == 3.0


def test_the_hooks_time_per_token_is_the_windows_not_the_warmups():
    import pandas as pd

    from harness.analysis import window

    # the warm-up's hook checks residency (0.5 s a token here), the window's does not
    gen = pd.DataFrame({"wall_s": [3.0, 2.0, 2.0, 2.0, 2.0], "hook_s": [0.5, 0.5, 0.001, 0.001, 0.001]})
    assert window.window_mean(gen, "hook_s", 2) == 0.001
    assert window.window_mean(gen, "hook_s", 1) > 0.1
    assert window.window_mean(gen, "no_such_column", 2) != window.window_mean(gen, "no_such_column", 2)


def test_the_window_against_the_tokens_after_it_holds_within_3_percent_or_not():
    import pandas as pd

    from harness.analysis import steady

    runs = pd.DataFrame({"run_id": ["a", "a", "b", "c"], "repeat": [1, 2, 1, 1],
                         "steady_tok_per_s": [1.0, 1.0, 1.0, 1.0],
                         "later_tok_per_s": [0.98, float("nan"), 0.8, 1.02],
                         "window_over_later": [1 / 0.98, float("nan"), 1.25, 1 / 1.02]})
    t = steady.window_against_later(runs)
    # repeat 2 decoded nothing past its window: not in the table
    assert list(zip(t.run_id, t.repeat)) == [("a", 1), ("b", 1), ("c", 1)]
    assert list(t.held) == [True, False, True]
    assert steady.window_against_later(runs.drop(columns="later_tok_per_s")).empty


REFERENCE_RUNS = Path(__file__).resolve().parents[1] / "reference/vm-2026-12-06/results/runs"


def _window_of(run: str, warmup: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """A committed reference run's measured window: per-token wall times and bytes read."""
    import pandas as pd

    tok = pd.read_csv(REFERENCE_RUNS / run / "rep1/tokens.csv")
    gen = tok[tok.phase == "gen"].iloc[warmup:]
    return gen.wall_s.to_numpy(float), gen.cgroup_read_bytes.to_numpy(float)


@pytest.mark.parametrize("run", ["pread-madvise-mlock@disk-box", "pread-madvise-mlock@seed-box"])
def test_the_drift_checks_stated_power_is_what_it_flags_on_real_token_noise(run):
    """Drawn from a reference window's own token noise (its residuals about the fitted line,
    resampled: not Gaussian): a drift of the size the check states it detects is flagged about
    DRIFT_POWER of the time, a flat window about never, and power() agrees with the rate."""
    wall, read = _window_of(run)
    y = wall / read
    x = np.arange(len(y), dtype=float)
    fit = np.polyfit(x, y, 1)
    resid = y - np.polyval(fit, x)
    base = steady.drift(wall, read_bytes=read)
    detectable = base.detectable
    assert base.se > 0 and base.df == len(y) - 2 and detectable > steady.DRIFT_BOUND
    assert abs(base.power(detectable) - steady.DRIFT_POWER) < 1e-6
    assert base.power(0.0) < 0.05 and base.power(1.0) > base.power(detectable)
    rng = np.random.default_rng(7)
    mean = y.mean()

    def flagged(change: float, n: int = 600) -> float:
        line = mean * (1 + change * (x / x[-1] - 0.5))  # `change` across the window
        hits = 0
        for _ in range(n):
            sim = (line + rng.choice(resid, len(y), replace=True)) * read
            hits += not steady.drift(sim, read_bytes=read).steady
        return hits / n

    assert flagged(0.0) <= 0.05
    rate = flagged(detectable)
    assert abs(rate - steady.DRIFT_POWER) < 0.12, rate  # what power() states is what it flags
    assert flagged(detectable / 2) < rate


def test_the_drift_power_table_states_what_each_configurations_windows_could_see():
    import pandas as pd

    runs = pd.DataFrame({"configuration": ["a", "a", "b", "b"],
                         "window_drift_detectable": [0.18, 0.3, 0.5, "nan"],
                         "window_drift_power": [0.6, 0.2, 0.05, 0.1]})
    t = steady.drift_power_table(runs).set_index("configuration")
    assert t.loc["a", "runs"] == 2 and t.loc["b", "runs"] == 1  # b's second run: not judged
    assert t.loc["a", "detectable_max"] == 0.3 and t.loc["a", "power_median"] == 0.4
    assert t.loc["a", "power_min"] == 0.2 and t.loc["b", "power_median"] == 0.05
    assert steady.drift_power_table(pd.DataFrame({"configuration": ["a"]})).empty
