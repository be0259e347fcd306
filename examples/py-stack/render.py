"""Template checking and rendering: the Mustache subset every engine reads alike (escaped
variables and comments). Anything else is refused with the field it is in, so nothing is
rendered differently from what the batch's author meant. Pure functions, no I/O."""
import html
import json
import re

TAG = re.compile(r"\{\{(.*?)\}\}", re.S)
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*(\.[A-Za-z_][A-Za-z0-9_\-]*)*$")


class TemplateError(ValueError):
    pass


def check(field, template):
    """Raises TemplateError naming `field` when `template` uses anything beyond the subset."""
    if "\\{{" in template:
        raise TemplateError(f"{field}: escaped delimiters (\\{{{{) are not supported")
    rest = TAG.sub("", template)
    if "{{" in rest:
        raise TemplateError(f"{field}: unterminated tag")
    for m in TAG.finditer(template):
        inner = m.group(1)
        if inner.startswith("!"):
            continue
        if inner.startswith("{") or "}" in inner or "{" in inner:
            raise TemplateError(f"{field}: unescaped or malformed tag {m.group(0)!r}")
        name = inner.strip()
        if name == "else" or not NAME.match(name):
            raise TemplateError(f"{field}: unsupported tag {m.group(0)!r} (only {{{{name}}}} and comments)")


def lookup(context, dotted):
    value = context
    for part in dotted.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        else:
            return ""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def render(template, context, raw=()):
    """`raw`: variables inserted unescaped — only flaw(html-unescaped-name) passes any."""
    def one(m):
        inner = m.group(1)
        if inner.startswith("!"):
            return ""
        value = lookup(context, inner.strip())
        return value if inner.strip() in raw else html.escape(value, quote=True)

    return TAG.sub(one, template)


def render_channel(template, channel, context):
    """flaw(template-by-id) only: (subject, text, html) of one channel, rendered at send time."""
    if channel == "email":
        return (render(template["subject"], context), render(template["text"], context),
                render(template["html"], context))
    return None, render(template[channel], context), None
