"""Pictures through the API with the official clients (OpenAI chat `image_url`, Responses
`input_image`, Anthropic `image`), every bad picture refused with a 400 that says what is allowed,
and the next request served as usual; a model without a tower refuses pictures."""
from __future__ import annotations

import base64

import pytest

from tests._pictures import VL, data_url, png
from tests._webapp_helpers import make_host, served

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

MODEL = "model"
QUESTION = "What is in the picture?"


def ask(url: str) -> list:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": QUESTION}]}]


@pytest.fixture(scope="module")
def vl_url(tiny_checkpoint):
    with served(make_host(tiny_checkpoint(**VL), image_max_bytes=200_000, image_max_count=2),
                keepalive=0.2) as (url, _):
        yield url


@pytest.fixture(scope="module")
def oai(vl_url):
    return openai.OpenAI(base_url=vl_url + "/v1", api_key="x", max_retries=0, _strict_response_validation=True)


def test_a_picture_reaches_the_model_through_each_protocol(vl_url, oai):
    replies = [oai.chat.completions.create(model=MODEL, messages=ask(data_url(s)), max_tokens=12, temperature=0)
               for s in (1, 2)]
    texts = [r.choices[0].message.content for r in replies]
    assert texts[0] != texts[1]                     # the picture matters
    assert replies[0].usage.prompt_tokens > 16      # the image tokens are in the prompt
    again = oai.chat.completions.create(model=MODEL, messages=ask(data_url(1)), max_tokens=12, temperature=0)
    assert again.choices[0].message.content == texts[0]
    assert again.usage.prompt_tokens_details.cached_tokens > 6   # the picture's state came from the prefix cache
    streamed = "".join(c.choices[0].delta.content or "" for c in oai.chat.completions.create(
        model=MODEL, messages=ask(data_url(1)), max_tokens=12, temperature=0, stream=True) if c.choices)
    assert streamed == texts[0]

    b64 = base64.b64encode(png(1)).decode()
    msg = anthropic.Anthropic(base_url=vl_url, api_key="x", max_retries=0, _strict_response_validation=True) \
        .messages.create(model=MODEL, max_tokens=12, extra_body={"temperature": 0}, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}},
            {"type": "text", "text": QUESTION}]}])
    assert msg.content[0].text == texts[0]
    resp = oai.responses.create(model=MODEL, max_output_tokens=12, temperature=0, input=[{"role": "user", "content": [
        {"type": "input_image", "image_url": data_url(1)}, {"type": "input_text", "text": QUESTION}]}])
    assert resp.output_text == texts[0]
    follow = oai.responses.create(model=MODEL, previous_response_id=resp.id, input="And its colours?",
                                  max_output_tokens=4, temperature=0)   # the stored turn keeps its picture
    assert follow.usage.input_tokens > resp.usage.input_tokens and follow.usage.input_tokens_details.cached_tokens > 6
    models = httpx.get(vl_url + "/v1/models").json()["data"]
    assert models[0]["input_modalities"] == ["text", "image"]


BAD = {
    "a web address": ("https://example.com/cat.png", "never fetches URLs"),
    "a file path": ("/etc/passwd", "never fetches URLs or reads files"),
    "a file URL": ("file:///etc/passwd", "never fetches URLs"),
    "an SVG": ("data:image/svg+xml;base64," + base64.b64encode(b"<svg xmlns='http://www.w3.org/2000/svg'/>").decode(),
               "SVG is not accepted"),
    "an SVG called a PNG": ("data:image/png;base64," + base64.b64encode(b"<svg xmlns='x'/>").decode(), "SVG"),
    "a truncated PNG": ("data:image/png;base64," + base64.b64encode(png(1)[:300]).decode(), "could not be decoded"),
    "a corrupt PNG": ("data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"junk" * 40).decode(),
                      "could not be decoded"),
}


def test_every_bad_picture_is_refused_and_the_next_request_is_served(oai, vl_url):
    for what, (url, says) in BAD.items():
        with pytest.raises(openai.BadRequestError) as e:
            oai.chat.completions.create(model=MODEL, messages=ask(url), max_tokens=4)
        assert says in e.value.message and "PNG, JPEG" in e.value.message, (what, e.value.message)
    with pytest.raises(openai.APIStatusError, match="at most 0.2 MB each") as e:   # 100 MB: refused unread
        oai.chat.completions.create(model=MODEL, messages=ask("data:image/png;base64," + "A" * 100_000_000),
                                    max_tokens=4)
    assert e.value.status_code == 413
    big = "data:image/png;base64," + base64.b64encode(png(1, width=300, height=300) + b"\0" * 300_000).decode()
    with pytest.raises(openai.BadRequestError, match="at most 0.2 MB a picture"):   # within the body, over a picture
        oai.chat.completions.create(model=MODEL, messages=ask(big), max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="at most 2"):
        oai.chat.completions.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_url(s)}} for s in range(3)]}])
    ant = anthropic.Anthropic(base_url=vl_url, api_key="x", max_retries=0)
    with pytest.raises(anthropic.BadRequestError, match="never fetches URLs"):
        ant.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}]}])
    with pytest.raises(openai.BadRequestError, match="never fetches URLs"):
        oai.responses.create(model=MODEL, max_output_tokens=4, input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "https://example.com/cat.png"}]}])
    ok = oai.chat.completions.create(model=MODEL, messages=ask(data_url(3)), max_tokens=4, temperature=0)
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_the_demo_model_has_no_tower_and_refuses_pictures_saying_so():
    from core.settings import DEMO_MODEL_DIR

    with served(make_host(DEMO_MODEL_DIR), keepalive=0.2) as (url, _):
        oai = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="no vision tower"):
            oai.chat.completions.create(model="demo", messages=ask(data_url(1)), max_tokens=4)
        with pytest.raises(anthropic.BadRequestError, match="no vision tower"):
            anthropic.Anthropic(base_url=url, api_key="x", max_retries=0).messages.create(
                model="demo", max_tokens=4, messages=[{"role": "user", "content": [{"type": "image", "source": {
                    "type": "base64", "media_type": "image/png", "data": base64.b64encode(png(1)).decode()}}]}])
        assert httpx.get(url + "/v1/models").json()["data"][0]["input_modalities"] == ["text"]
        assert oai.chat.completions.create(model="demo", messages=[{"role": "user", "content": "Hi"}],
                                           max_tokens=3).choices
