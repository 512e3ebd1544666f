"""decodescope-generate in-process on the tiny model: every speculative flag prints the plain greedy text and
the schedule's figures; bad values are named."""
import pytest

from engine import cli

pytestmark = pytest.mark.usefixtures("one_thread")
BASE = ["--tiny", "-p", "one two one two one two", "-n", "24", "--seed", "0"]


def run(capsys, *flags):
    code = cli.main([*BASE, *flags])
    out = capsys.readouterr()
    return code, out.out, out.err


SELF_DRAFT = ["--mode", "self-draft", "--self-draft"]


@pytest.mark.parametrize("flags", [["--mode", "n-gram", "-k", "8"], [*SELF_DRAFT, "q4"], [*SELF_DRAFT, "int8"],
                                   ["--mode", "self-draft"],
                                   ["--mode", "layer-skip"], ["--mode", "layer-skip", "--layers", "2"],
                                   ["--mode", "layer-skip", "--layers", "2", "--no-adaptive"]])
def test_speculative_flags_print_the_plain_text(capsys, flags):
    # --tiny writes fresh random weights from a fixed seed, so every run sees the same model
    code, plain, _ = run(capsys)
    assert code == 0
    code, text, err = run(capsys, *flags)
    assert code == 0 and text == plain, flags
    assert "acceptance" in err or "plain steps 100%" in err
    assert "mean k" in err
    if flags == ["--mode", "layer-skip"]:
        assert "layer_set: calibrated" in err and "skipped_layers" in err


def test_bad_values_are_named(capsys):
    code, _, err = run(capsys, "--mode", "layer-skip", "--layers", "9")
    assert code == 2 and "n_layers=9" in err
    code, _, err = run(capsys, "--mode", "n-gram", "-k", "0")
    assert code == 2 and "k=0 is out of range; pick 1..16" in err
    code, _, err = run(capsys, "--temperature", "5")
    assert code == 2 and "temperature=5 is out of range; pick 0..2" in err
    for flags in (["--self-draft", "q3"], ["--layers", "many"], ["--mode", "sideways"]):
        with pytest.raises(SystemExit):
            cli.parse_args([*BASE, *flags])


def test_flags_are_the_request_fields():
    from engine.request import NAMES, Request

    args = cli.parse_args(["-p", "x"])
    assert {n: getattr(args, n) for n in NAMES if n != "model"} == {
        n: v for n, v in Request().flat().items() if n != "model"}


@pytest.mark.parametrize("flags, shown", [(["--weights", "q4"], "weights q4"), (["--weights", "fp16"], "weights fp16"),
                                          (["--window", "16", "--sinks", "2"], "attention window 16 + 2 sinks")])
def test_weights_and_window_flags_reach_the_engine(capsys, flags, shown):
    code, text, err = run(capsys, *flags)
    assert code == 0 and text and shown in err


def test_a_bad_window_is_named(capsys):
    code, _, err = run(capsys, "--window", "8")
    assert code == 2 and "window=8 is out of range; pick 0 (full attention) or 16..8192" in err
