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


@pytest.mark.parametrize("flags", [["--ngram", "-k", "8"], ["--self-draft", "q4"], ["--self-draft", "int8"],
                                   ["--layer-skip"], ["--layer-skip", "2"], ["--layer-skip", "2", "--fixed-k"]])
def test_speculative_flags_print_the_plain_text(capsys, flags):
    # --tiny writes fresh random weights from a fixed seed, so every run sees the same model
    code, plain, _ = run(capsys)
    assert code == 0
    code, text, err = run(capsys, *flags)
    assert code == 0 and text == plain, flags
    assert "acceptance" in err or "plain steps 100%" in err
    assert "mean k" in err
    if flags == ["--layer-skip"]:
        assert "layer_set: calibrated" in err and "skipped_layers" in err


def test_bad_values_are_named(capsys):
    code, _, err = run(capsys, "--layer-skip", "many")
    assert code == 2 and "--layer-skip 'many'" in err
    code, _, err = run(capsys, "--layer-skip", "9")
    assert code == 2 and "n_layers=9" in err
    with pytest.raises(SystemExit):
        cli.parse_args([*BASE, "--self-draft", "q3"])


@pytest.mark.parametrize("flags, shown", [(["--weights", "q4"], "weights q4"), (["--weights", "fp16"], "weights fp16"),
                                          (["--window", "8", "--sinks", "2"], "attention window 8 + 2 sinks")])
def test_weights_and_window_flags_reach_the_engine(capsys, flags, shown):
    code, text, err = run(capsys, *flags)
    assert code == 0 and text and shown in err


def test_a_bad_window_is_named(capsys):
    code, _, err = run(capsys, "--window", "0")
    assert code == 2 and "window=0" in err
