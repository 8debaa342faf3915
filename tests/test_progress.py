"""The one progress protocol (analysis.base.progress): progress(done, total), and nested spans."""

from analysis.base.progress import tell, within


def test_tell_calls_only_a_given_progress_with_integers():
    calls = []
    tell(None, 1, 2)  # no progress: nothing to call
    tell(lambda done, total: calls.append((done, total)), 3.0, None)
    tell(lambda done, total: calls.append((done, total)), 2, 5.0)
    assert calls == [(3, None), (2, 5)]
    assert all(type(done) is int for done, _ in calls) and type(calls[1][1]) is int


def test_within_maps_an_inner_count_onto_its_span_of_the_outer_total():
    """Inner loops of 4 and 3 steps fill outer steps 0-8 and 8-12 of 12: each inner (done, 4) is
    told as (⌊8·done/4⌋, 12), each (done, 3) as (8 + ⌊4·done/3⌋, 12); unknown totals stay at the start."""
    calls = []
    outer = lambda done, total: calls.append((done, total))  # noqa: E731
    first = within(outer, 0, 8, 12)
    for done in range(1, 5):
        first(done, 4)
    second = within(outer, 8, 4, 12)
    second(0, None)
    for done in range(1, 4):
        second(done, 3)
    second(7, 3)  # past its end: held at the span's end
    assert calls == [(2, 12), (4, 12), (6, 12), (8, 12), (8, 12), (9, 12), (10, 12), (12, 12), (12, 12)]
    assert within(None, 0, 1, 1) is None


def test_the_command_lines_bar_counts_in_its_unit_on_rank_0_only(capsys):
    """``analysis.cli.common.progress_bar``: rank 0 draws a bar of ``total`` in the unit it is given
    (images by default, steps for patch training); another rank draws nothing."""
    import torch

    from analysis.cli.common import progress_bar
    from analysis.cli.distributed import Ranks

    with progress_bar(
        Ranks(rank=0, world=1, device=torch.device("cpu"), distributed=False), 4, "patch training", unit="step"
    ) as advance:
        advance(2)
        advance(4, 4)
    drawn = capsys.readouterr().err
    assert "patch training" in drawn and "4/4" in drawn and "step/s" in drawn and "img" not in drawn
    with progress_bar(Ranks(rank=0, world=1, device=torch.device("cpu"), distributed=False), 3, "images") as advance:
        advance(3)
    assert "img/s" in capsys.readouterr().err
    with progress_bar(
        Ranks(rank=1, world=2, device=torch.device("cpu"), distributed=False), 4, "patch training", unit="step"
    ) as advance:
        advance(4)
    assert capsys.readouterr().err == ""
