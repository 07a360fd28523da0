"""Drives a running wllm server with the official `openai` package:
one streamed and one plain chat completion, one completion, models.list(),
structured output through `client.chat.completions.parse` with a pydantic
model (response_format json_schema, strict), a required tool call, whole and streamed, and
embeddings.create (base64, the client's default, and float).
Usage: python3 scripts/openai_smoke.py BASE_URL MODEL"""
import sys

from openai import OpenAI

base, model = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base, api_key="unused")

models = [m.id for m in client.models.list()]
assert model in models, models

msgs = [{"role": "user", "content": "What is the capital of France?"}]
plain = client.chat.completions.create(model=model, messages=msgs, max_tokens=12, temperature=0)
text = plain.choices[0].message.content
assert "Paris" in text, text
assert plain.usage.completion_tokens > 0 and plain.choices[0].finish_reason in ("stop", "length")

pieces = []
for chunk in client.chat.completions.create(model=model, messages=msgs, max_tokens=12, temperature=0, stream=True):
    if chunk.choices and chunk.choices[0].delta.content:
        pieces.append(chunk.choices[0].delta.content)
assert "".join(pieces) == text, ("".join(pieces), text)

comp = client.completions.create(model=model, prompt="The capital of France is", max_tokens=4, temperature=0)
assert comp.choices[0].text.startswith(" Paris"), comp.choices[0].text
from pydantic import BaseModel, Field


class City(BaseModel):
    name: str = Field(max_length=20)
    country: str = Field(max_length=20)
    population_millions: int = Field(ge=0, le=50)


parsed = client.chat.completions.parse(
    model=model,
    messages=[{"role": "user", "content": "Describe Paris as JSON."}],
    response_format=City,
    max_tokens=80,
    temperature=0,
)
city = parsed.choices[0].message.parsed
assert isinstance(city, City), parsed.choices[0].message.content
tools = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                         "required": ["city"], "additionalProperties": False}}}]
tc = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Weather in Paris?"}],
                                    tools=tools, tool_choice="required", max_tokens=60, temperature=0)
call = tc.choices[0].message.tool_calls[0]
assert call.function.name == "get_weather" and tc.choices[0].finish_reason == "tool_calls", tc
import json
assert "city" in json.loads(call.function.arguments), call.function.arguments
# Streamed: the client's chunks carry the call's name, then its arguments piece by piece.
name, args, pieces = None, "", 0
for chunk in client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Weather in Paris?"}],
                                            tools=tools, tool_choice="required", max_tokens=60, temperature=0,
                                            stream=True):
    for d in chunk.choices[0].delta.tool_calls or []:
        name = name or d.function.name
        if d.function.arguments:
            args += d.function.arguments
            pieces += 1
assert name == "get_weather" and args == call.function.arguments and pieces > 1, (name, args, pieces)
# Embeddings: the client asks for base64 by default and decodes it; floats when asked.
texts = ["The cat sat on the mat.", "A kitten rested on the rug.", "Quarterly revenue rose by four percent."]
emb = client.embeddings.create(model=model, input=texts)
vecs = [d.embedding for d in emb.data]
assert [d.index for d in emb.data] == [0, 1, 2] and emb.usage.prompt_tokens > 0, emb
floats = client.embeddings.create(model=model, input=texts[0], encoding_format="float").data[0].embedding
assert len(floats) == len(vecs[0]) and max(abs(a - b) for a, b in zip(floats, vecs[0])) < 1e-6
cos = lambda a, b: sum(x * y for x, y in zip(a, b)) / (sum(x * x for x in a) * sum(y * y for y in b)) ** 0.5
assert abs(cos(vecs[0], vecs[0]) - 1) < 1e-6 and cos(vecs[0], vecs[1]) > cos(vecs[0], vecs[2]), \
    (cos(vecs[0], vecs[1]), cos(vecs[0], vecs[2]))
print("openai smoke: embeddings", len(vecs[0]), "dims, cosine similar/unrelated",
      round(cos(vecs[0], vecs[1]), 4), round(cos(vecs[0], vecs[2]), 4))
print("openai smoke: ok:", repr(text), repr(comp.choices[0].text), models, city, call.function.arguments)
