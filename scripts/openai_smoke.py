"""Drives a running wllm server with the official `openai` package:
one streamed and one plain chat completion, one completion, models.list(),
structured output through `client.chat.completions.parse` with a pydantic
model (response_format json_schema, strict), and a required tool call, whole and streamed.
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
print("openai smoke: ok:", repr(text), repr(comp.choices[0].text), models, city, call.function.arguments)
