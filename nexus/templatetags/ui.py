"""The console UI kit's template tags and filters: `{% load ui %}` (docs/ui.md has each one).

Filters write numbers through `nexus.ui.format`; `{% badge %}` renders `nexus.ui.badges`; the
component tags render the partials under `templates/ui/`.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django import template
from django.template import Engine, Template
from django.template.base import FilterExpression, Parser, Token, token_kwargs
from django.template.context import Context
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import slugify

from nexus.ui import badges, format
from nexus.ui.charts import BarChart, TimeSeries
from nexus.ui.navigation import NAVIGATION

register = template.Library()


# Numbers (UI.md, "Numbers"): one filter per kind of quantity. A value a template cannot find
# (Django gives "") or that is no number is missing: "—".


def _quantity(value: object) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return value
    try:
        return float(str(value))
    except ValueError:
        return None


@register.filter
def number(value: object) -> str:
    """{{ 1204|number }} → 1,204"""
    return format.number(_quantity(value))


@register.filter
def duration(seconds: object) -> str:
    """{{ 0.038|duration }} → 38 ms; {{ 185|duration }} → 3 min 5 s"""
    return format.duration(_quantity(seconds))


@register.filter
def duration_ms(milliseconds: object) -> str:
    """{{ 1234|duration_ms }} → 1.2 s"""
    return format.duration_ms(_quantity(milliseconds))


@register.filter
def rate(per_second: object, unit: str) -> str:
    """{{ 958.2|rate:"tok" }} → 958 tok/s"""
    return format.rate(_quantity(per_second), unit)


@register.filter
def binary_size(size: object) -> str:
    """{{ 268435456|binary_size }} → 256 MiB"""
    return format.binary_size(_quantity(size))


@register.filter
def count(value: object, nouns: str) -> str:
    """{{ 2|count:"replica" }} → 2 replicas; {{ 1|count:"entry,entries" }} → 1 entry"""
    noun, _, plural_form = nouns.partition(",")
    amount = _quantity(value)
    return format.count(None if amount is None else int(amount), noun, plural_form)


@register.filter
def percent(value: object, of: float = 1.0) -> str:
    """{{ 0.31|percent }} → 31 %; {{ 37.5|percent:100 }} → 38 %"""
    return format.percent(_quantity(value), float(of))


@register.filter
def absolute(when: datetime | None) -> str:
    """{{ node.created_at|absolute }} → 2025-01-02 13:04:05 UTC"""
    return format.absolute(when)


@register.simple_tag
def ago(when: object, empty: str = format.MISSING) -> SafeString:
    """{% ago node.last_seen_at "never" %} → <time title="(absolute)">3 min ago</time>.

    nexus.js keeps the words current while the page stays open (`data-ago`).
    """
    if not isinstance(when, datetime):
        return format_html("{}", empty)
    return format_html(
        '<time datetime="{}" title="{}" data-ago>{}</time>',
        when.isoformat(),
        format.absolute(when),
        format.ago(when, timezone.now()),
    )


# State badges.


@register.simple_tag
def badge(kind: str | badges.Badge, *args: Any, **kwargs: Any) -> SafeString:
    """{% badge "node" node.trust node.status since=node.status_changed_at error=node.last_error %}

    Or a Badge built in Python: {% badge row.badge %}. Written here rather than in a partial: a
    table shows one per row, and this is several times cheaper to render.
    """
    built = kind if isinstance(kind, badges.Badge) else badges.build(kind, *args, **kwargs)
    return format_html(
        '<span class="badge" data-tone="{}" data-state="{}" title="{}">'
        '<span class="badge-icon" aria-hidden="true">{}</span> {}</span>',
        built.tone,
        built.state,
        built.reason,
        built.icon,
        built.text,
    )


# Components.


@register.inclusion_tag("ui/copy_button.html")
def copy_button(value: str, what: str = "", label: str = "Copy") -> dict[str, Any]:
    """{% copy_button pool.model_name what="the model name" %}"""
    return {"value": value, "what": what, "label": label}


@register.inclusion_tag("ui/empty_state.html")
def empty_state(
    title: str, text: str = "", action_url: str = "", action_label: str = ""
) -> dict[str, Any]:
    """{% empty_state "No pools yet" "Group targets …" action_url=url action_label="Add pool" %}

    Pass the action only to those who may take it; the text says what to do otherwise.
    """
    return {"title": title, "text": text, "action_url": action_url, "action_label": action_label}


@register.inclusion_tag("ui/api_snippets.html", takes_context=True)
def api_snippets(
    context: Context, model: str, tokens: Any = (), secret: str = "", id: str = "snippets"
) -> dict[str, Any]:
    """{% api_snippets "@pool/chat" tokens=my_tokens %}: curl and `openai` calls of the model.

    The base URL is this server's own /v1. The token chooser offers a placeholder, the tokens
    given (by prefix only: a secret is never stored) and, right after issuing one, its secret.
    """
    request = context.get("request")
    base_url = request.build_absolute_uri("/v1") if request is not None else "/v1"
    choices = [{"value": "$NEXUS_TOKEN", "label": "Placeholder: $NEXUS_TOKEN"}]
    if secret:
        choices.insert(0, {"value": secret, "label": "The token just issued"})
    for token in tokens:
        label = f"{token.name} ({token.prefix}…): paste its secret"
        choices.append({"value": f"{token.prefix}…", "label": label})
    return {
        "id": id,
        "model": model,
        "base_url": base_url,
        "choices": choices,
        "token": choices[0]["value"],
    }


@register.inclusion_tag("ui/time_chart.html")
def time_chart(chart: TimeSeries) -> dict[str, Any]:
    """{% time_chart requests_chart %}: a uPlot chart of a TimeSeries (nexus.ui.charts)."""
    return {"chart": chart}


@register.simple_tag(takes_context=True)
def chart_data(context: Context, chart: TimeSeries) -> SafeString:
    """{% chart_data chart %}: a chart's columns, which a push replaces by id to move it."""
    return format_html(
        '<div id="{}-data" data-chart-data="{}" hidden{}></div>',
        chart["id"],
        json.dumps(chart, separators=(",", ":"), allow_nan=False),
        oob(context),
    )


@register.inclusion_tag("ui/bar_chart.html")
def bar_chart(chart: BarChart) -> dict[str, Any]:
    """{% bar_chart share %}: a server-rendered SVG bar chart (nexus.ui.charts.bar_chart)."""
    return {"chart": chart}


@register.inclusion_tag("ui/navigation.html", takes_context=True)
def navigation(context: Context) -> dict[str, Any]:
    """The left navigation, with the current page's item marked."""
    request = context.get("request")
    match = getattr(request, "resolver_match", None)
    current = match.view_name if match is not None else ""
    sections = []
    for section, items in NAVIGATION:
        entries = []
        for item in items:
            try:
                url = reverse(item.url_name) if item.url_name else ""
            except NoReverseMatch:
                url = ""
            entries.append({"label": item.label, "url": url, "current": item.is_current(current)})
        sections.append({"title": section, "items": entries})
    return {"sections": sections}


@register.simple_tag
def live_socket(*parts: object) -> SafeString:
    """{% block socket %}{% live_socket "deployments" deployment.pk %}{% endblock %}: the page's
    one websocket, /ws/deployments/12/ (base.html puts it on <main>)."""
    path = "/ws/" + "".join(f"{part}/" for part in parts)
    return format_html(' hx-ext="ws" ws-connect="{}" data-live', path)


@register.simple_tag(takes_context=True)
def oob(context: Context) -> SafeString:
    """<section id="x"{% oob %}>: marks a partial out of band when it is rendered for a push."""
    return mark_safe(' hx-swap-oob="true"') if context.get("oob") else mark_safe("")


# Block components: a tag with a body, rendered through its partial under templates/ui/.


class ComponentNode(template.Node):
    """Render a partial with the tag's arguments and its rendered body as `body`."""

    def __init__(
        self, template_name: str, nodelist: Any, kwargs: dict[str, FilterExpression]
    ) -> None:
        self.template_name = template_name
        self.nodelist = nodelist
        self.kwargs = kwargs

    def values(self, context: Context) -> dict[str, Any]:
        values = {name: value.resolve(context) for name, value in self.kwargs.items()}
        # What forms inside a component need from the page.
        values["csrf_token"] = context.get("csrf_token")
        values["request"] = context.get("request")
        return values

    def render(self, context: Context) -> str:
        values = self.values(context)
        values["body"] = mark_safe(self.nodelist.render(context))
        return _partial(context, self.template_name).render(context.new(values))


def _partial(context: Context, name: str) -> Template:
    """Return one of the kit's partials from the engine rendering the page."""
    engine = context.template.engine if context.template is not None else Engine.get_default()
    return engine.get_template(name)


def _component(parser: Parser, token: Token) -> tuple[Any, dict[str, Any]]:
    bits = token.split_contents()
    name, rest = bits[0], bits[1:]
    kwargs = token_kwargs(rest, parser)
    if rest:
        raise template.TemplateSyntaxError(f"{name} takes only name=value arguments: {rest}")
    nodelist = parser.parse((f"end{name}",))
    parser.delete_first_token()
    return nodelist, kwargs


@register.tag
def card(parser: Parser, token: Token) -> ComponentNode:
    """{% card title="Targets" id="targets" %}…{% endcard %}; `oob=oob` marks it for pushes."""
    nodelist, kwargs = _component(parser, token)
    return ComponentNode("ui/card.html", nodelist, kwargs)


@register.tag
def confirm_dialog(parser: Parser, token: Token) -> ComponentNode:
    """{% confirm_dialog id="delete" title="Delete demo?" action=url confirm="Delete" %}
    what will happen, with true counts{% endconfirm_dialog %}; opened by data-dialog="delete"."""
    nodelist, kwargs = _component(parser, token)
    return ComponentNode("ui/confirm_dialog.html", nodelist, kwargs)


@register.tag
def code_block(parser: Parser, token: Token) -> ComponentNode:
    """{% code_block language="sh" label="Start the agent" %}nexus-agent …{% endcode_block %}

    With a copy button. The body is shown as written: start it right after the tag.
    """
    nodelist, kwargs = _component(parser, token)
    return ComponentNode("ui/code_block.html", nodelist, kwargs)


@register.tag
def drawer(parser: Parser, token: Token) -> ComponentNode:
    """{% drawer id="route" title="Route" %}…{% enddrawer %}; opened by data-drawer="route"."""
    nodelist, kwargs = _component(parser, token)
    return ComponentNode("ui/drawer.html", nodelist, kwargs)


class TabNode(template.Node):
    """One tab of `{% tabs %}`: its label and body, rendered by the TabsNode."""

    def __init__(self, label: FilterExpression, nodelist: Any) -> None:
        self.label = label
        self.nodelist = nodelist

    def render(self, context: Context) -> str:
        # Rendered only through TabsNode; stray text is not output.
        return ""


class TabsNode(ComponentNode):
    def render(self, context: Context) -> str:
        values = self.values(context)
        group = slugify(values.get("id") or "tabs")
        tabs = []
        for index, node in enumerate(n for n in self.nodelist if isinstance(n, TabNode)):
            label = str(node.label.resolve(context))
            tabs.append(
                {
                    "id": f"{group}-{slugify(label) or index}",
                    "label": label,
                    "body": mark_safe(node.nodelist.render(context)),
                    "selected": index == 0,
                }
            )
        values.update(id=group, tabs=tabs)
        return _partial(context, self.template_name).render(context.new(values))


@register.tag
def tabs(parser: Parser, token: Token) -> TabsNode:
    """{% tabs id="params" label="Runtime parameters" %}
    {% tab "vLLM" %}…{% endtab %}{% tab "SGLang" %}…{% endtab %}{% endtabs %}"""
    nodelist, kwargs = _component(parser, token)
    return TabsNode("ui/tabs.html", nodelist, kwargs)


@register.tag
def tab(parser: Parser, token: Token) -> TabNode:
    bits = token.split_contents()
    if len(bits) != 2:
        raise template.TemplateSyntaxError('{% tab "Label" %} takes one label')
    nodelist = parser.parse(("endtab",))
    parser.delete_first_token()
    return TabNode(parser.compile_filter(bits[1]), nodelist)
