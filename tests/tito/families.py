"""Tiny tokenizers in other model families' token layouts, each with a chat template written in
that family's format, for the model-format tests (`gyre.tito.model_format`).

`family_tokenizer(name, folder)` takes the tiny model's byte-level BPE (`gyre.model.recipe`), adds
the family's control tokens, sets its BOS/EOS and template, writes a `generation_config.json` with
the family's end IDs and loads the folder back with `AutoTokenizer` (so `name_or_path` is the
folder, as for a real model). `FAMILIES` holds, per family, the vLLM parser names and one reply in
the family's format whose template re-renders it exactly. The templates are gyre's own, written
after each family's published format (Qwen 2.5/3 hermes-style, Llama 3.1 JSON tool calls, Mistral
v11 `[TOOL_CALLS]name[ARGS]`, DeepSeek V3/R1).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from transformers import AutoTokenizer

from gyre.model.recipe import build_tokenizer

QWEN_TEMPLATE = """
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}{% else %}You are helpful.{% endif %}

# Tools

<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>

Return each call as a JSON object within <tool_call></tool_call> tags.<|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'system' and loop.first %}
{%- elif m.role == 'assistant' %}<|im_start|>assistant
{% if m.reasoning_content %}<think>
{{ m.reasoning_content.strip('\\n') }}
</think>

{% endif %}{% set content = (m.content or '').lstrip('\\n') %}{{ content }}
{%- for tc in m.tool_calls or [] %}{% if not loop.first or content %}
{% endif %}<tool_call>
{"name": {{ tc.function.name | tojson }}, "arguments": {{ tc.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

LLAMA_TEMPLATE = """{{- bos_token }}
{%- if messages[0].role == 'system' %}{% set sys = messages[0].content %}
{%- set rest = messages[1:] %}{% else %}{% set sys = '' %}{% set rest = messages %}{% endif -%}
<|start_header_id|>system<|end_header_id|>

{% if tools %}Answer with a JSON function call {"name": name, "parameters": object}. Functions:
{% for t in tools %}{{ t | tojson }}
{% endfor %}{% endif %}{{ sys }}<|eot_id|>
{%- for m in rest %}
{%- if m.role == 'assistant' and m.tool_calls %}<|start_header_id|>assistant<|end_header_id|>

{% for tc in m.tool_calls %}{"name": "{{ tc.function.name }}", "parameters": \
{{ tc.function.arguments | tojson }}}{% endfor %}<|eot_id|>
{%- elif m.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>

{{ m.content }}<|eot_id|>
{%- else %}<|start_header_id|>{{ m.role }}<|end_header_id|>

{{ m.content }}<|eot_id|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""

MISTRAL_TEMPLATE = """{{- bos_token }}
{%- if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}
{%- for m in messages %}
{%- if m.role == 'system' %}[SYSTEM_PROMPT]{{ m.content }}[/SYSTEM_PROMPT]
{%- elif m.role == 'user' %}[INST]{{ m.content }}[/INST]
{%- elif m.role == 'assistant' %}{{ m.content or '' }}
{%- for tc in m.tool_calls or [] %}[TOOL_CALLS]{{ tc.function.name }}[ARGS]\
{{ tc.function.arguments }}{% endfor %}{{ eos_token }}
{%- elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.content }}[/TOOL_RESULTS]
{%- endif %}
{%- endfor %}"""

DEEPSEEK_TEMPLATE = """{{- bos_token }}
{%- if messages[0].role == 'system' %}{{ messages[0].content }}{% endif %}
{%- for m in messages %}
{%- if m.role == 'user' %}<｜User｜>{{ m.content }}
{%- elif m.role == 'assistant' %}<｜Assistant｜>
{%- if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}
{{- m.content or '' }}
{%- if m.tool_calls %}<｜tool▁calls▁begin｜>
{%- for tc in m.tool_calls %}<｜tool▁call▁begin｜>function<｜tool▁sep｜>{{ tc.function.name }}
```json
{{ tc.function.arguments }}
```<｜tool▁call▁end｜>{% endfor %}<｜tool▁calls▁end｜>{% endif %}<｜end▁of▁sentence｜>
{%- elif m.role == 'tool' %}<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>{{ m.content }}\
<｜tool▁output▁end｜><｜tool▁outputs▁end｜>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<｜Assistant｜>{% endif %}"""


@dataclass(frozen=True)
class Family:
    """One family: its token layout, template and vLLM parsers, and a reply in its format."""

    template: str
    specials: tuple[str, ...]
    """Control tokens (added as special tokens)."""
    bos: str | None
    eos: str
    end_tokens: tuple[str, ...]
    """`generation_config.json` `eos_token_id`, as tokens (a list when several)."""
    tool_parser: str
    reasoning_parser: str
    arguments_as: str
    """How the template wants tool-call arguments (`ChatRenderer.arguments_as`)."""
    call_reply: str
    """The first reply: reasoning (if the family has it) and one `read_file` call of
    `{"path": "a.py"}`, written exactly as the template re-renders it."""
    reasoning: str | None
    """The reasoning the parser finds in `call_reply`."""
    final_reply: str
    """The second reply, plain text (after the tool result)."""
    final_content: str = "It holds one line."
    """The content the parsers find in `final_reply`."""


FAMILIES = {
    "qwen": Family(
        template=QWEN_TEMPLATE,
        specials=("<|im_start|>", "<|im_end|>", "<|endoftext|>"),
        bos=None,
        eos="<|im_end|>",
        end_tokens=("<|im_end|>", "<|endoftext|>"),
        tool_parser="hermes",
        reasoning_parser="qwen3",
        arguments_as="mapping",
        call_reply='<think>\nlook first\n</think>\n\n<tool_call>\n{"name": "read_file", '
        '"arguments": {"path": "a.py"}}\n</tool_call>',
        reasoning="\nlook first\n",
        final_reply="<think>\ndone\n</think>\n\nIt holds one line.",
        final_content="\n\nIt holds one line.",  # vLLM's qwen3 parser keeps the newlines
    ),
    "llama3": Family(
        template=LLAMA_TEMPLATE,
        specials=(
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
            "<|eom_id|>",
            "<|python_tag|>",
        ),
        bos="<|begin_of_text|>",
        eos="<|eot_id|>",
        end_tokens=("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"),
        tool_parser="llama3_json",
        reasoning_parser="none",
        arguments_as="mapping",
        call_reply='{"name": "read_file", "parameters": {"path": "a.py"}}',
        reasoning=None,
        final_reply="It holds one line.",
    ),
    "mistral": Family(
        template=MISTRAL_TEMPLATE,
        specials=(
            "<s>",
            "</s>",
            "[INST]",
            "[/INST]",
            "[TOOL_CALLS]",
            "[ARGS]",
            "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]",
            "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]",
            "[SYSTEM_PROMPT]",
            "[/SYSTEM_PROMPT]",
        ),
        bos="<s>",
        eos="</s>",
        end_tokens=("</s>",),
        tool_parser="mistral",
        reasoning_parser="none",
        arguments_as="string",
        call_reply='[TOOL_CALLS]read_file[ARGS]{"path": "a.py"}',
        reasoning=None,
        final_reply="It holds one line.",
    ),
    "deepseek": Family(
        template=DEEPSEEK_TEMPLATE,
        specials=(
            "<｜begin▁of▁sentence｜>",
            "<｜end▁of▁sentence｜>",
            "<｜User｜>",
            "<｜Assistant｜>",
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁calls▁end｜>",
            "<｜tool▁call▁begin｜>",
            "<｜tool▁call▁end｜>",
            "<｜tool▁sep｜>",
            "<｜tool▁outputs▁begin｜>",
            "<｜tool▁outputs▁end｜>",
            "<｜tool▁output▁begin｜>",
            "<｜tool▁output▁end｜>",
        ),
        bos="<｜begin▁of▁sentence｜>",
        eos="<｜end▁of▁sentence｜>",
        end_tokens=("<｜end▁of▁sentence｜>",),
        tool_parser="deepseek_v3",
        reasoning_parser="deepseek_r1",
        arguments_as="string",
        call_reply="<think>look first</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function"
        '<｜tool▁sep｜>read_file\n```json\n{"path": "a.py"}\n```<｜tool▁call▁end｜>'
        "<｜tool▁calls▁end｜>",
        reasoning="look first",
        final_reply="<think>done</think>It holds one line.",
    ),
}


def family_tokenizer(name: str, folder: Path):
    """The family's tiny tokenizer, saved to and loaded back from `folder` (with its
    `generation_config.json`)."""
    fam = FAMILIES[name]
    tok = build_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": list(fam.specials)})
    if fam.bos is not None:
        tok.bos_token = fam.bos
    tok.eos_token = fam.eos
    tok.chat_template = fam.template
    folder.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(folder)
    ends = [tok.convert_tokens_to_ids(t) for t in fam.end_tokens]
    config = {"eos_token_id": ends if len(ends) > 1 else ends[0]}
    (folder / "generation_config.json").write_text(json.dumps(config))
    return AutoTokenizer.from_pretrained(folder)
