"""The real `openai` Python client against a running `sparkling serve` (tests/serve_openai.rs
starts the server and runs this script): chat and completions, streaming and not, `stop`,
`seed`, `usage`, and a 401 / 400 raised as the client's own exception types.

Usage: python tests/openai_client.py BASE_URL API_KEY
"""

import sys

import openai


def main() -> None:
    base, key = sys.argv[1], sys.argv[2]
    c = openai.OpenAI(base_url=base, api_key=key, max_retries=0)
    models = c.models.list()
    model = models.data[0].id

    r = c.chat.completions.create(model=model, messages=[{"role": "system", "content": "Be brief."},
                                                        {"role": "user", "content": "What is 2+2?"}], max_tokens=24)
    text = r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length"), r
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0, r.usage
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens

    # Streaming gives the same text (T = 0), and the usage chunk when asked for.
    s = c.chat.completions.create(model=model, messages=[{"role": "system", "content": "Be brief."},
                                                        {"role": "user", "content": "What is 2+2?"}], max_tokens=24,
                                  stream=True, stream_options={"include_usage": True})
    parts, usage = [], None
    for chunk in s:
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            if ch.delta.content:
                parts.append(ch.delta.content)
    assert "".join(parts) == text, ("".join(parts), text)
    assert usage is not None and usage.completion_tokens == r.usage.completion_tokens, usage

    # A stop string is never emitted.
    if len(text) > 4:
        stop = text[2:4]
        r2 = c.chat.completions.create(model=model, messages=[{"role": "system", "content": "Be brief."},
                                                             {"role": "user", "content": "What is 2+2?"}],
                                       max_tokens=24, stop=[stop])
        assert r2.choices[0].message.content == text[: text.find(stop)], (r2.choices[0].message.content, stop)
        assert r2.choices[0].finish_reason == "stop"

    # Completions; a seed reproduces a sampled answer.
    a = c.completions.create(model=model, prompt="Once upon a time", max_tokens=16, temperature=0.9, seed=7)
    b = c.completions.create(model=model, prompt="Once upon a time", max_tokens=16, temperature=0.9, seed=7)
    assert a.choices[0].text == b.choices[0].text, (a, b)
    st = c.completions.create(model=model, prompt="Once upon a time", max_tokens=16, temperature=0.9, seed=7, stream=True)
    assert "".join(x.choices[0].text for x in st if x.choices) == a.choices[0].text

    # Errors as the client's own exception types.
    try:
        openai.OpenAI(base_url=base, api_key="wrong", max_retries=0).models.list()
        raise AssertionError("a wrong key was accepted")
    except openai.AuthenticationError:
        pass
    try:
        c.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], n=2)
        raise AssertionError("n = 2 was accepted")
    except openai.BadRequestError as e:
        assert "n" in str(e)
    print("openai client: ok")


if __name__ == "__main__":
    main()
