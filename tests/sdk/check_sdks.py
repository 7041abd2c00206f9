"""The official OpenAI and Anthropic Python SDKs, pointed at the seawall gateway.

Why: the gateway claims to be a drop-in base URL for both SDKs. Only the real packages can
show that their request shapes, stream parsers, pagination and error classes accept what
the gateway sends. tests/python_sdks.rs starts the gateway and runs this script; it can also
be run by hand against `cargo run --example gateway`:

    SEAWALL_GATEWAY_URL=http://127.0.0.1:8080 SEAWALL_GATEWAY_KEY=<a GATEWAY_KEYS entry> \
        python3 tests/sdk/check_sdks.py

Every check asserts on what it got and the script exits non-zero, naming each failed check,
if any fails. The SDKs' own retries are off (max_retries=0): the gateway alone handles
faults, so a fault that reached the SDK would fail a check. The last check leaves them at
their default, to see that the gateway's errors stop them.
"""

import os
import sys
import time
import traceback

try:
    import anthropic
    import openai
except ImportError as e:
    sys.exit(
        f"missing Python package: {e}. Install the pinned SDKs with\n"
        "    python3 -m pip install -r tests/sdk/requirements.txt\n"
        "(or point SEAWALL_PYTHON at a Python that has them)."
    )

URL = os.environ.get("SEAWALL_GATEWAY_URL", "http://127.0.0.1:8080").rstrip("/")
# Any non-empty key works against a gateway without GATEWAY_KEYS.
KEY = os.environ.get("SEAWALL_GATEWAY_KEY") or "no-key-needed"
PROMPT = [{"role": "user", "content": "Say hello."}]
# A prompt carrying it is answered by an upstream whose quota ran out (tests/python_sdks.rs).
QUOTA_MARKER = "QUOTA-EXHAUSTED-UPSTREAM"
# A prompt carrying it has its first stream cut after a few tokens (tests/python_sdks.rs).
CUT_MARKER = "CUT-THIS-STREAM-ONCE"
CUT_PROMPT = [{"role": "user", "content": f"{CUT_MARKER} Tell me about the sea."}]

oa = openai.OpenAI(base_url=f"{URL}/v1", api_key=KEY, max_retries=0, timeout=30.0)
an = anthropic.Anthropic(base_url=URL, api_key=KEY, max_retries=0, timeout=30.0)


class CheckFailed(Exception):
    pass


def expect(condition, message):
    if not condition:
        raise CheckFailed(message)


def openai_chat_complete():
    r = oa.chat.completions.create(model="gpt-4o", max_tokens=32, messages=PROMPT)
    choice = r.choices[0]
    expect(choice.message.content, f"empty content: {r}")
    expect(choice.finish_reason in ("stop", "length"), f"finish_reason {choice.finish_reason!r}")
    expect(r.usage and r.usage.prompt_tokens > 0, f"no prompt usage: {r.usage}")
    expect(r.usage.completion_tokens > 0, f"no completion usage: {r.usage}")
    return f"{r.usage.completion_tokens} tokens, finish_reason={choice.finish_reason}"


def read_chat_stream(stream):
    """A Chat Completions stream's text, finish reason, usage and number of chunks."""
    text, finish, usage, chunks = [], None, None, 0
    for chunk in stream:
        chunks += 1
        expect(chunk.object == "chat.completion.chunk", f"chunk {chunk}")
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                text.append(choice.delta.content)
            if choice.finish_reason:
                finish = choice.finish_reason
    return "".join(text), finish, usage, chunks


def chat_stream(messages):
    """A gpt-4o stream of `messages` with its usage chunk, read by `read_chat_stream`."""
    return read_chat_stream(oa.chat.completions.create(
        model="gpt-4o",
        max_tokens=32,
        messages=messages,
        stream=True,
        stream_options={"include_usage": True},
    ))


def openai_chat_stream():
    text, finish, usage, chunks = chat_stream(PROMPT)
    expect(text, f"no content in {chunks} chunks")
    expect(finish in ("stop", "length"), f"finish_reason {finish!r}")
    expect(usage and usage.completion_tokens > 0, f"no usage chunk: {usage}")
    return f"{chunks} chunks, finish_reason={finish}"


def openai_cut_stream_is_continued():
    """A stream cut after its first tokens reaches the SDK as one whole stream: the gateway's
    continuation asked for the rest and spliced it in."""
    text, finish, usage, chunks = chat_stream(CUT_PROMPT)
    expect(len(text.split()) > 5, f"only {text!r} in {chunks} chunks")
    expect(finish in ("stop", "length"), f"finish_reason {finish!r}")
    expect(usage and usage.completion_tokens > 5, f"no usage chunk: {usage}")
    return f"{len(text.split())} words in {chunks} chunks, finish_reason={finish}"


def openai_models():
    ids = [m.id for m in oa.models.list()]
    expect("gpt-4o" in ids and "gpt-4o-mini" in ids, f"models: {ids}")
    expect(not any(i.startswith("claude") for i in ids), f"Claude models in OpenAI's list: {ids}")
    one = oa.models.retrieve("gpt-4o-mini")
    expect(one.id == "gpt-4o-mini" and one.object == "model", f"retrieved {one}")
    return ", ".join(ids)


def openai_errors():
    try:
        oa.chat.completions.create(model="no-such-model", max_tokens=8, messages=PROMPT)
        raise CheckFailed("an unpriced model was served")
    except openai.BadRequestError as e:
        expect(e.status_code == 400, f"status {e.status_code}")
        expect(e.code == "model_not_available", f"code {e.code!r}: {e.body}")
    bad = openai.OpenAI(base_url=f"{URL}/v1", api_key="wrong-key", max_retries=0)
    if os.environ.get("SEAWALL_GATEWAY_KEY"):
        try:
            bad.models.list()
            raise CheckFailed("a wrong key was accepted")
        except openai.AuthenticationError as e:
            expect(e.code == "invalid_api_key", f"code {e.code!r}: {e.body}")
    return "BadRequestError (unpriced model), AuthenticationError (wrong key)"


def anthropic_message():
    m = an.messages.create(model="claude-sonnet-4-5", max_tokens=32, messages=PROMPT)
    expect(m.type == "message" and m.role == "assistant", f"not a message: {m}")
    expect(m.content and m.content[0].type == "text", f"content: {m.content}")
    expect(m.content[0].text, f"empty text: {m}")
    expect(m.stop_reason in ("end_turn", "max_tokens"), f"stop_reason {m.stop_reason!r}")
    expect(m.usage.input_tokens > 0 and m.usage.output_tokens > 0, f"usage {m.usage}")
    return f"{m.usage.output_tokens} tokens, stop_reason={m.stop_reason}"


def read_message_stream(want_cache=None, **ask):
    """The event types of a Messages stream and the message the SDK's helper assembles, every
    kind of event checked present (and the cache's verdict, if asked)."""
    seen = []
    with an.messages.stream(**ask) as s:
        if want_cache:
            status = cache_status(s.response)
            expect(status == want_cache, f"streamed call: {status!r}")
        for event in s:
            seen.append(event.type)
        final = s.get_final_message()
    for kind in ("message_start", "content_block_start", "content_block_delta",
                 "content_block_stop", "message_delta", "message_stop"):
        expect(kind in seen, f"no {kind} event in {seen}")
    return seen, final


def anthropic_stream():
    seen, final = read_message_stream(model="claude-sonnet-4-5", max_tokens=32, messages=PROMPT)
    expect(final.content and final.content[0].text, f"empty final message: {final}")
    expect(final.stop_reason in ("end_turn", "max_tokens"), f"stop_reason {final.stop_reason!r}")
    expect(final.usage.output_tokens > 0, f"usage {final.usage}")
    # The raw-event iterator (`stream=True`) parses the same stream.
    raw = an.messages.create(
        model="claude-sonnet-4-5", max_tokens=32, messages=PROMPT, stream=True
    )
    raw_types = [e.type for e in raw]
    expect(raw_types and raw_types[-1] == "message_stop", f"raw events {raw_types}")
    return f"{seen.count('content_block_delta')} deltas, stop_reason={final.stop_reason}"


def anthropic_cut_stream_is_continued():
    """The same through the Messages API: one message, its events in order, assembled by the
    SDK's helper."""
    seen, final = read_message_stream(model="claude-sonnet-4-5", max_tokens=32,
                                      messages=CUT_PROMPT)
    expect(seen.count("message_start") == 1 and seen[-1] == "message_stop", f"events {seen}")
    text = final.content[0].text if final.content else ""
    expect(len(text.split()) > 5, f"only {text!r}")
    expect(final.stop_reason in ("end_turn", "max_tokens"), f"stop_reason {final.stop_reason!r}")
    return f"{len(text.split())} words, {seen.count('content_block_delta')} deltas, " \
        f"stop_reason={final.stop_reason}"


def anthropic_models():
    models = list(an.models.list())
    ids = [m.id for m in models]
    expect("claude-sonnet-4-5" in ids and "claude-haiku-4-5" in ids, f"models: {ids}")
    expect(not any(i.startswith("gpt") for i in ids), f"GPT models in Anthropic's list: {ids}")
    expect(all(m.type == "model" and m.display_name for m in models), f"{models}")
    one = an.models.retrieve("claude-haiku-4-5")
    expect(one.id == "claude-haiku-4-5", f"retrieved {one}")
    return ", ".join(ids)


def anthropic_errors():
    try:
        an.messages.create(model="no-such-model", max_tokens=8, messages=PROMPT)
        raise CheckFailed("an unpriced model was served")
    except anthropic.BadRequestError as e:
        expect(e.status_code == 400, f"status {e.status_code}")
        expect(e.body["type"] == "error", f"body {e.body}")
        expect(e.body["error"]["type"] == "invalid_request_error", f"body {e.body}")
    bad = anthropic.Anthropic(base_url=URL, api_key="wrong-key", max_retries=0)
    if os.environ.get("SEAWALL_GATEWAY_KEY"):
        try:
            bad.models.list()
            raise CheckFailed("a wrong key was accepted")
        except anthropic.AuthenticationError as e:
            expect(e.body["error"]["type"] == "authentication_error", f"body {e.body}")
    return "BadRequestError (unpriced model), AuthenticationError (wrong key)"


# With the gateway's cache on (GATEWAY_CACHE_TTL; tests/python_sdks.rs sets it and these two):
# which answers it replays, to whom, and whether each SDK parses the replays.
CACHED = bool(os.environ.get("SEAWALL_GATEWAY_CACHE"))
OTHER_KEY = os.environ.get("SEAWALL_GATEWAY_OTHER_KEY")
CACHE_PROMPT = [{"role": "user", "content": "Name a sea, from the cache if you have it."}]


def cache_status(raw):
    return raw.headers.get("x-seawall-cache")


def openai_cache_replays():
    """A greedy question (temperature 0) asked again, streamed or not, is replayed as the
    answer the upstream gave; a sampled one and another client's are not."""
    if not CACHED:
        return "skipped: the gateway runs without a cache"
    ask = dict(model="gpt-4o", max_tokens=32, temperature=0, messages=CACHE_PROMPT)
    raw = oa.chat.completions.with_raw_response.create(**ask)
    expect(cache_status(raw) == "miss", f"first call: {cache_status(raw)!r}")
    first = raw.parse()
    text = first.choices[0].message.content
    expect(text, f"empty content: {first}")

    raw = oa.chat.completions.with_raw_response.create(**ask)
    expect(cache_status(raw) == "hit", f"second call: {cache_status(raw)!r}")
    again = raw.parse()
    expect(again.choices[0].message.content == text, f"replayed {again} for {first}")
    expect(again.choices[0].finish_reason == first.choices[0].finish_reason, f"{again}")
    expect(again.usage and again.usage.completion_tokens == first.usage.completion_tokens,
           f"replayed usage {again.usage} for {first.usage}")

    raw = oa.chat.completions.with_raw_response.create(
        **ask, stream=True, stream_options={"include_usage": True})
    expect(cache_status(raw) == "hit", f"streamed call: {cache_status(raw)!r}")
    streamed, finish, usage, chunks = read_chat_stream(raw.parse())
    expect(streamed == text, f"streamed replay {streamed!r} for {text!r}")
    expect(finish == first.choices[0].finish_reason, f"streamed finish {finish!r}")
    expect(usage and usage.completion_tokens == first.usage.completion_tokens,
           f"streamed usage {usage}")

    sampled = dict(ask, temperature=0.7)
    raw = oa.chat.completions.with_raw_response.create(**sampled)
    expect(cache_status(raw) == "bypass", f"sampled call: {cache_status(raw)!r}")
    raw = oa.chat.completions.with_raw_response.create(
        **ask, extra_headers={"Cache-Control": "no-store"})
    expect(cache_status(raw) == "bypass", f"no-store call: {cache_status(raw)!r}")
    if OTHER_KEY:
        other = openai.OpenAI(base_url=f"{URL}/v1", api_key=OTHER_KEY, max_retries=0)
        raw = other.chat.completions.with_raw_response.create(**ask)
        expect(cache_status(raw) == "miss", f"another client's call: {cache_status(raw)!r}")
    return f"miss, hit, streamed hit in {chunks} chunks, sampled and no-store bypass, " \
        "other client's miss"


def anthropic_cache_replays():
    """The same through the Messages API: a streamed replay of a non-streamed answer is
    a complete event stream the SDK's helpers assemble into the same message."""
    if not CACHED:
        return "skipped: the gateway runs without a cache"
    # The Messages API's own default is sampling; this SDK has no `temperature` argument, so
    # the greedy request says so in the body.
    ask = dict(model="claude-sonnet-4-5", max_tokens=32, messages=CACHE_PROMPT,
               extra_body={"temperature": 0})
    raw = an.messages.with_raw_response.create(**ask)
    expect(cache_status(raw) == "miss", f"first call: {cache_status(raw)!r}")
    first = raw.parse()
    text = first.content[0].text
    expect(text, f"empty text: {first}")

    raw = an.messages.with_raw_response.create(**ask)
    expect(cache_status(raw) == "hit", f"second call: {cache_status(raw)!r}")
    again = raw.parse()
    expect(again.content[0].text == text and again.stop_reason == first.stop_reason,
           f"replayed {again} for {first}")
    expect(again.usage.output_tokens == first.usage.output_tokens, f"usage {again.usage}")

    seen, final = read_message_stream(want_cache="hit", **ask)
    expect(final.content[0].text == text, f"streamed replay {final} for {first}")
    expect(final.stop_reason == first.stop_reason, f"streamed stop_reason {final.stop_reason!r}")
    expect(final.usage.output_tokens == first.usage.output_tokens, f"usage {final.usage}")

    raw = an.messages.with_raw_response.create(**dict(ask, extra_body={"temperature": 0.7}))
    expect(cache_status(raw) == "bypass", f"sampled call: {cache_status(raw)!r}")
    raw = an.messages.with_raw_response.create(**ask, extra_headers={"cache-control": "no-store"})
    expect(cache_status(raw) == "bypass", f"no-store call: {cache_status(raw)!r}")
    if OTHER_KEY:
        other = anthropic.Anthropic(base_url=URL, api_key=OTHER_KEY, max_retries=0)
        raw = other.messages.with_raw_response.create(**ask)
        expect(cache_status(raw) == "miss", f"another client's call: {cache_status(raw)!r}")
    return f"miss, hit, streamed hit ({seen.count('content_block_delta')} deltas), sampled " \
        "and no-store bypass, other client's miss"


def sdk_retries_stop_at_the_gateway():
    """The gateway is the one retry loop: its errors say `x-should-retry: false`, so each SDK,
    at its default two retries, makes one attempt at a call whose upstream quota ran out (a
    429 it would otherwise retry). A prompt with QUOTA_MARKER meets an exhausted quota
    upstream, and tests/python_sdks.rs counts the attempts that arrive marked as retries
    (`x-stainless-retry-count`). This check runs last: the quota opens the gateway's circuit
    for the models it tried."""
    prompt = [{"role": "user", "content": f"{QUOTA_MARKER} Say hello."}]
    client = openai.OpenAI(base_url=f"{URL}/v1", api_key=KEY, timeout=30.0)
    try:
        client.chat.completions.create(model="gpt-4o", max_tokens=8, messages=prompt)
        raise CheckFailed("a call past the quota was answered")
    except openai.RateLimitError as e:
        expect(e.response.headers.get("x-should-retry") == "false", f"headers {e.response.headers}")
    client = anthropic.Anthropic(base_url=URL, api_key=KEY, timeout=30.0)
    try:
        client.messages.create(model="claude-sonnet-4-5", max_tokens=8, messages=prompt)
        raise CheckFailed("a call past the quota was answered")
    except anthropic.RateLimitError as e:
        expect(e.response.headers.get("x-should-retry") == "false", f"headers {e.response.headers}")
    return "RateLimitError with x-should-retry: false, at the SDKs' default retries"


CHECKS = [
    openai_chat_complete,
    openai_chat_stream,
    openai_cut_stream_is_continued,
    openai_models,
    openai_errors,
    anthropic_message,
    anthropic_stream,
    anthropic_cut_stream_is_continued,
    anthropic_models,
    anthropic_errors,
    openai_cache_replays,
    anthropic_cache_replays,
    sdk_retries_stop_at_the_gateway,
]


def pinned():
    """The versions tests/sdk/requirements.txt pins, by package."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "requirements.txt")
    with open(path) as f:
        lines = (line.split("#")[0].strip() for line in f)
        return dict(line.split("==", 1) for line in lines if "==" in line)


def main():
    print(f"openai {openai.__version__}, anthropic {anthropic.__version__}, gateway {URL}")
    for package, version in (("openai", openai.__version__), ("anthropic", anthropic.__version__)):
        wanted = pinned().get(package)
        if wanted and wanted != version:
            # Not a failure: a newer SDK should work too, and if it does not, that is news.
            print(f"note: {package} {version} is installed, requirements.txt pins {wanted}")
    failed = []
    for check in CHECKS:
        start = time.monotonic()
        try:
            summary = check()
            print(f"ok   {check.__name__} ({time.monotonic() - start:.2f}s): {summary}")
        except CheckFailed as e:
            failed.append(check.__name__)
            print(f"FAIL {check.__name__}: {e}")
        except Exception:  # an SDK exception is a failed check too, with its story
            failed.append(check.__name__)
            print(f"FAIL {check.__name__}: unexpected exception\n{traceback.format_exc()}")
    if failed:
        sys.exit(f"{len(failed)} of {len(CHECKS)} SDK checks failed: {', '.join(failed)}")
    print(f"all {len(CHECKS)} SDK checks passed")


if __name__ == "__main__":
    main()
