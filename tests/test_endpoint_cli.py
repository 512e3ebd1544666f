"""decodescope-generate --endpoint: the same stats line from a serving engine, the key from the environment only."""
from __future__ import annotations

from engine.cli import main
from tests.endpoint_fake import FakeServer, chunk, sse

ENDPOINT = ["--backend", "endpoint", "--endpoint"]
KEY = "sk-cli-93b1d7"
EVENTS = [chunk("Hello"), chunk(" there"), chunk(None, finish="length"),
          {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}]


def test_generate_against_an_endpoint_prints_the_stats_line(monkeypatch, capsys):
    monkeypatch.setenv("DS_TEST_KEY", KEY)
    with FakeServer(sse(EVENTS, gap_s=0.01)) as fake:
        rc = main([*ENDPOINT, fake.url, "--server", "openai", "--endpoint-model", "m", "--api-key-env",
                   "DS_TEST_KEY", "-p", "hi", "-n", "2", "--no-chat"])
    out, err = capsys.readouterr()
    assert rc == 0 and out.strip() == "Hello there"
    assert "2 tokens | TTFT" in err and "tok/s" in err and "peak" not in err
    assert "ITL per chunk" in err and "stop: length" in err
    assert fake.requests[0]["headers"]["Authorization"] == f"Bearer {KEY}"
    req = fake.requests[0]  # --no-chat: the completion API, the prompt as it is
    assert req["path"] == "/v1/completions" and req["body"]["prompt"] == "hi" and req["body"]["max_tokens"] == 2
    assert KEY not in out + err


def test_a_missing_key_variable_and_a_bad_url_fail_before_any_request(capsys):
    assert main([*ENDPOINT, "http://127.0.0.1:9/v1", "--api-key-env", "DS_NOT_SET_ANYWHERE", "-p", "x"]) == 2
    assert "DS_NOT_SET_ANYWHERE: that variable is not set" in capsys.readouterr().err
    assert main([*ENDPOINT, "file:///etc/passwd", "-p", "x"]) == 2
    assert "not an http(s) URL" in capsys.readouterr().err


def test_a_failed_endpoint_run_exits_1_with_the_reason(capsys):
    from tests.endpoint_fake import free_port

    assert main([*ENDPOINT, f"http://127.0.0.1:{free_port()}/v1", "--server", "openai", "--endpoint-model", "m",
                 "-p", "x"]) == 1
    assert "cannot connect" in capsys.readouterr().err


def test_a_servers_control_characters_are_shown_not_sent_to_the_terminal(capsys):
    events = [chunk("\x1b]0;pwned\x07red \x1b[31mtext\r"), chunk(None, finish="stop\x1b[2J")]
    with FakeServer(sse(events)) as fake:
        assert main([*ENDPOINT, fake.url, "--server", "openai", "--endpoint-model", "m", "-p", "hi"]) == 0
    out, err = capsys.readouterr()
    assert "\x1b" not in out + err and "\x07" not in out and "\r" not in out
    assert "\\x1b]0;pwned\\x07red \\x1b[31mtext\\r" in out and "stop: stop\\x1b[2J" in err
