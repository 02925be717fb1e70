"""Chat templates: published templates render exactly the prompts their models were trained on; models
without a template get the right built-in one; stop tokens and BOS are handled.

The template strings below are copied from the models' tokenizer_config.json files (public on the Hugging
Face hub); the expected prompts are written out by hand from the models' documented chat formats.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from llamacy.chat_template import ChatTemplate, ChatTemplateError
from llamacy.errors import UsageError

# HuggingFaceTB/SmolLM2-135M-Instruct (also stored in the default model's GGUF file).
SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# meta-llama/Meta-Llama-3-8B-Instruct
LLAMA3 = json.loads(
    r""""{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}" """
)

# meta-llama/Llama-3.2-1B-Instruct: strftime_now, date_string, tools rendered with tojson(indent=4).
LLAMA32 = """{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

# Qwen/Qwen2.5-7B-Instruct, as the JSON string value in tokenizer_config.json.
QWEN25 = json.loads(
    r""""{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == 'system' %}\n        {{- messages[0]['content'] }}\n    {%- else %}\n        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n    {%- endif %}\n    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n    {%- for tool in tools %}\n        {{- \"\\n\" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n{%- else %}\n    {%- if messages[0]['role'] == 'system' %}\n        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n    {%- else %}\n        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n{%- for message in messages %}\n    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or (message.role == \"assistant\" and not message.tool_calls) %}\n        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n    {%- elif message.role == \"assistant\" %}\n        {{- '<|im_start|>' + message.role }}\n        {%- if message.content %}\n            {{- '\\n' + message.content }}\n        {%- endif %}\n        {%- for tool_call in message.tool_calls %}\n            {%- if tool_call.function is defined %}\n                {%- set tool_call = tool_call.function %}\n            {%- endif %}\n            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n            {{- tool_call.name }}\n            {{- '\", \"arguments\": ' }}\n            {{- tool_call.arguments | tojson }}\n            {{- '}\\n</tool_call>' }}\n        {%- endfor %}\n        {{- '<|im_end|>\\n' }}\n    {%- elif message.role == \"tool\" %}\n        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n            {{- '<|im_start|>user' }}\n        {%- endif %}\n        {{- '\\n<tool_response>\\n' }}\n        {{- message.content }}\n        {{- '\\n</tool_response>' }}\n        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n            {{- '<|im_end|>\\n' }}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n" """
)

# google/gemma-3-*-it, as the JSON string value in tokenizer_config.json.
GEMMA3 = json.loads(
    r""""{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n    {%- if messages[0]['content'] is string -%}\n        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n    {%- else -%}\n        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n    {%- endif -%}\n    {%- set loop_messages = messages[1:] -%}\n{%- else -%}\n    {%- set first_user_prefix = \"\" -%}\n    {%- set loop_messages = messages -%}\n{%- endif -%}\n{%- for message in loop_messages -%}\n    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n    {%- endif -%}\n    {%- if (message['role'] == 'assistant') -%}\n        {%- set role = \"model\" -%}\n    {%- else -%}\n        {%- set role = message['role'] -%}\n    {%- endif -%}\n    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n    {%- if message['content'] is string -%}\n        {{ message['content'] | trim }}\n    {%- elif message['content'] is iterable -%}\n        {%- for item in message['content'] -%}\n            {%- if item['type'] == 'image' -%}\n                {{ '<start_of_image>' }}\n            {%- elif item['type'] == 'text' -%}\n                {{ item['text'] | trim }}\n            {%- endif -%}\n        {%- endfor -%}\n    {%- else -%}\n        {{ raise_exception(\"Invalid content type\") }}\n    {%- endif -%}\n    {{ '<end_of_turn>\\n' }}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n    {{'<start_of_turn>model\\n'}}\n{%- endif -%}\n" """
)

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Name the capital of France."},
]


def _model(tmp_path_factory, arch: str):
    from llamacy.gguf import GGUFFile
    from llamacy.tokenizer import Tokenizer
    from tests.model_factory import write_tiny_model

    path = write_tiny_model(tmp_path_factory.mktemp(arch) / f"{arch}.gguf", arch=arch)
    metadata = dict(GGUFFile(path).metadata)
    return metadata, Tokenizer.from_metadata(metadata)


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    """A tiny llama model: byte-level BPE vocabulary with the ChatML tokens, ChatML template."""
    return _model(tmp_path_factory, "llama")


@pytest.fixture(scope="module")
def spm(tmp_path_factory):
    """A tiny gemma3 model: SentencePiece vocabulary with <bos>, <start_of_turn>, <end_of_turn>; add_bos."""
    return _model(tmp_path_factory, "gemma3")


def template(source: str, tokenizer, tmp_path: Path) -> ChatTemplate:
    f = tmp_path / "template.jinja"
    f.write_text(source, encoding="utf-8")
    return ChatTemplate.from_model({}, tokenizer, override=f)


# ---- published templates ---------------------------------------------------------------------------------


def test_smollm2_template_adds_its_default_system_prompt(bpe, tmp_path):
    tpl = template(SMOLLM2, bpe[1], tmp_path)
    assert tpl.render([{"role": "user", "content": "Name the capital of France."}]) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nName the capital of France.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert tpl.render(CONVERSATION) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nHi there<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nName the capital of France.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert tpl.render(CONVERSATION[:3], add_generation_prompt=False).endswith("Hello!<|im_end|>\n")


def test_default_model_carries_the_smollm2_template(default_model_path):
    from llamacy.gguf import GGUFFile
    from llamacy.tokenizer import Tokenizer

    md = GGUFFile(default_model_path).metadata
    assert md["tokenizer.chat_template"] == SMOLLM2
    tok = Tokenizer.from_metadata(md)
    tpl = ChatTemplate.from_model(md, tok)
    assert (tpl.name, tpl.builtin) == ("model", False)
    assert tok.vocab.token_to_id["<|im_end|>"] in tpl.stop_ids
    assert "<|im_end|>" in tpl.stop_strings and "<|im_start|>" in tpl.stop_strings
    ids = tpl.encode(tpl.render([{"role": "user", "content": "Hi"}]))
    assert ids[0] == tok.vocab.token_to_id["<|im_start|>"] and ids.count(tok.bos_id) == 3  # no extra BOS


def test_llama3_template(bpe, tmp_path):
    tpl = template(LLAMA3, bpe[1], tmp_path)
    messages = [*CONVERSATION[:3], {"role": "user", "content": "  Name the capital of France.\n"}]
    assert tpl.render(messages, bos_token="<|begin_of_text|>") == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nName the capital of France.<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_llama32_template_dates_and_tools(bpe, tmp_path):
    tpl = template(LLAMA32, bpe[1], tmp_path)
    bos = {"bos_token": "<|begin_of_text|>"}
    messages = CONVERSATION[:2]
    assert tpl.render(messages, date_string="26 Jul 2024", **bos) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
        "You are terse.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    # No date given: the template asks strftime_now for today's.
    today = datetime.now().strftime("%d %b %Y")
    assert f"Today Date: {today}\n" in tpl.render(messages, **bos)
    # Tools go into the first user message, as tojson(indent=4) writes them.
    tool = {"name": "now", "description": "l'heure à Paris"}
    out = tpl.render(messages, tools=[tool], date_string="26 Jul 2024", **bos)
    assert out == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Environment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
        "You are terse.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\n"
        "Given the following functions, please respond with a JSON for a function call with its proper "
        "arguments that best answers the given prompt.\n\n"
        'Respond in the format {"name": function name, "parameters": dictionary of argument name and its '
        "value}.Do not use variables.\n\n"
        '{\n    "name": "now",\n    "description": "l\'heure à Paris"\n}\n\n'
        "Hi there<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    with pytest.raises(ChatTemplateError, match="no first user message"):
        tpl.render(CONVERSATION[:1], tools=[tool])


def test_qwen25_template(bpe, tmp_path):
    tpl = template(QWEN25, bpe[1], tmp_path)
    assert tpl.render([{"role": "user", "content": "Hi"}]) == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tpl.render(CONVERSATION) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nHi there<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nName the capital of France.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    tool = {"type": "function", "function": {"name": "weather", "description": "Météo"}}
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "18°C"},
    ]  # fmt: skip
    assert tpl.render(messages, tools=[tool]) == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n"
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        '{"type": "function", "function": {"name": "weather", "description": "Météo"}}\n</tools>\n\n'
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n18°C\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


GEMMA_EXPECTED = (
    "<bos><start_of_turn>user\nYou are terse.\n\nHi there<end_of_turn>\n"
    "<start_of_turn>model\nHello!<end_of_turn>\n"
    "<start_of_turn>user\nName the capital of France.<end_of_turn>\n"
    "<start_of_turn>model\n"
)


def test_gemma3_template(spm, tmp_path):
    tpl = template(GEMMA3, spm[1], tmp_path)
    assert tpl.render(CONVERSATION) == GEMMA_EXPECTED
    assert tpl.render([{"role": "user", "content": " Hi \n"}]) == (
        "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    )
    with pytest.raises(ChatTemplateError, match="must alternate"):
        tpl.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


# ---- built-in templates for models without one ------------------------------------------------------------


def test_gemma_without_template_gets_the_gemma_builtin(spm):
    metadata, tok = spm
    metadata = {k: v for k, v in metadata.items() if k != "tokenizer.chat_template"}
    tpl = ChatTemplate.from_model(metadata, tok)
    assert (tpl.name, tpl.builtin) == ("gemma", True)
    assert "built-in gemma" in tpl.describe()
    assert tpl.render(CONVERSATION) == GEMMA_EXPECTED  # the same prompt as Gemma 3's published template
    end = tok.vocab.token_to_id["<end_of_turn>"]
    assert end in tpl.stop_ids and tok.eos_id in tpl.stop_ids
    assert "<end_of_turn>" in tpl.stop_strings and "<start_of_turn>" in tpl.stop_strings
    # The rendered text starts with <bos>: the model wants BOS, but it must not get two.
    ids = tpl.encode(tpl.render(CONVERSATION))
    assert ids[:2] == [tok.bos_id, tok.vocab.token_to_id["<start_of_turn>"]] and ids.count(tok.bos_id) == 1


def test_builtin_choice_follows_the_vocabulary(bpe, spm):
    metadata, tok = bpe
    plain = {k: v for k, v in metadata.items() if k != "tokenizer.chat_template"}
    tpl = ChatTemplate.from_model(plain, tok)
    assert (tpl.name, tpl.builtin) == ("chatml", True)
    assert tpl.render(CONVERSATION[1:2]) == "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    # A non-Gemma architecture with Gemma's turn tokens still gets Gemma turns.
    stok = spm[1]
    assert ChatTemplate.from_model({"general.architecture": "llama"}, stok).name == "gemma"


def test_llama3_vocabulary_gets_the_llama3_builtin(bpe):
    from llamacy.chat_template import choose_builtin

    class Llama3Vocab:  # the header and end-of-turn tokens are all the choice looks at
        def __init__(self) -> None:
            self.token_to_id = {"<|start_header_id|>": 1, "<|end_header_id|>": 2, "<|eot_id|>": 3}

    class Tok:
        vocab = Llama3Vocab()

    assert choose_builtin({"general.architecture": "llama"}, Tok())[0] == "llama3"


def test_builtin_gemma_on_the_real_gemma_model(gemma_model_path):
    from llamacy.gguf import GGUFFile
    from llamacy.tokenizer import Tokenizer

    md = GGUFFile(gemma_model_path).metadata
    assert "tokenizer.chat_template" not in md  # why the built-in matters
    tok = Tokenizer.from_metadata(md)
    tpl = ChatTemplate.from_model(md, tok)
    assert (tpl.name, tpl.builtin) == ("gemma", True)
    ids = tpl.encode(tpl.render([{"role": "user", "content": "Name the capital of France."}]))
    assert ids[:3] == [2, 105, 2364] and ids[-3:] == [105, 4368, 107]  # <bos><start_of_turn>user … model\n
    assert 106 in tpl.stop_ids  # <end_of_turn>


# ---- the Jinja environment --------------------------------------------------------------------------------


def test_override_file_wins_and_names_the_template(bpe, tmp_path):
    metadata, tok = bpe
    f = tmp_path / "mine.jinja"
    f.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}>", encoding="utf-8")
    tpl = ChatTemplate.from_model(metadata, tok, override=f)
    assert (tpl.name, tpl.builtin) == ("mine.jinja", False)
    assert tpl.render(CONVERSATION[1:3]) == "[user] Hi there\n[assistant] Hello!\n>"
    with pytest.raises(UsageError, match="cannot read chat template"):
        ChatTemplate.from_model(metadata, tok, override=tmp_path / "missing.jinja")
    f.write_text("{% for m in messages %}", encoding="utf-8")
    with pytest.raises(UsageError, match="does not compile"):
        ChatTemplate.from_model(metadata, tok, override=f)


def test_hf_features_loop_controls_tojson_generation_tags(bpe, tmp_path):
    src = (
        "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
        "{% generation %}{{ m | tojson }}{% endgeneration %};{% endfor %}"
        "{{ {'a': [1, 2]} | tojson(indent=2) }}"
    )
    tpl = template(src, bpe[1], tmp_path)
    messages = [
        {"role": "user", "content": "café <b>"},
        {"role": "assistant", "content": "x"},
        {"role": "user"},
    ]
    assert tpl.render(messages) == (
        '{"role": "user", "content": "café <b>"};{"role": "assistant", "content": "x"};'
        '{\n  "a": [\n    1,\n    2\n  ]\n}'
    )


def test_block_whitespace_is_trimmed_as_in_transformers(bpe, tmp_path):
    # trim_blocks drops the newline after a block tag, lstrip_blocks the indentation before one.
    src = "{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}"
    tpl = template(src, bpe[1], tmp_path)
    assert tpl.render(CONVERSATION) == "[Hi there]\n[Name the capital of France.]\n"


def test_templates_are_sandboxed(bpe, tmp_path):
    escape = template("{{ ''.__class__.__mro__[1].__subclasses__() }}", bpe[1], tmp_path)
    with pytest.raises(ChatTemplateError):
        escape.render(CONVERSATION)
    mutate = template("{{ messages.append({'role': 'user'}) }}", bpe[1], tmp_path)
    with pytest.raises(ChatTemplateError):
        mutate.render(CONVERSATION)
    boom = template("{{ raise_exception('no system role') }}", bpe[1], tmp_path)
    with pytest.raises(ChatTemplateError, match="no system role"):
        boom.render(CONVERSATION)
