"""The kit's template tags, filters and partials render what docs/ui.md promises (`{% load ui %}`),
and every stored state of every model has its badge."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.template import Context, Template
from django.test import Client, RequestFactory
from django.utils import timezone

from deployments.models import DeploymentState, NodeState
from nexus.models import ApiToken
from nexus.ui import badges, charts
from nodes.models import NodeStatus, NodeTrust
from pools.models import RoutingOutcome, TargetHealth, TargetState
from serving.autoscaling import Outcome as ScaleOutcome
from serving.models import RevisionState, RouteState, ServiceLifecycle
from serving.tokens import TokenStatus
from tests.nexus.factories import make_user


def render(source: str, **context: object) -> str:
    return Template("{% load ui %}" + source).render(Context(context)).strip()


@pytest.mark.parametrize(
    ("source", "value", "written"),
    [
        ("{{ v|duration }}", 0.038, "38 ms"),
        ("{{ v|duration_ms }}", 1234, "1.2 s"),
        ('{{ v|rate:"tok" }}', 958.3, "958 tok/s"),
        ("{{ v|binary_size }}", 268435456, "256 MiB"),
        ('{{ v|count:"replica" }}', 2, "2 replicas"),
        ('{{ v|count:"entry,entries" }}', 1, "1 entry"),
        ("{{ v|percent }}", 0.312, "31 %"),
        ("{{ v|percent:100 }}", 37.5, "38 %"),
        ("{{ v|number }}", 1204, "1,204"),
        # What a template cannot find is missing, not zero.
        ("{{ missing.field|binary_size }}", None, "—"),
        ("{{ v|number }}", "not a number", "—"),
    ],
)
def test_number_filters_write_through_the_one_formatter(
    source: str, value: object, written: str
) -> None:
    assert render(source, v=value) == written


def test_ago_gives_the_absolute_time_in_its_title_and_ages_in_the_browser() -> None:
    when = timezone.now() - timedelta(minutes=3, seconds=5)

    html = render("{% ago when %}|{% ago never 'never' %}", when=when, never=None)

    assert html == (
        f'<time datetime="{when.isoformat()}" title="{when.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"'
        " data-ago>3 min ago</time>|never"
    )


def test_a_badge_has_words_a_shape_a_tone_and_its_reason_in_the_title() -> None:
    html = render('{% badge "deployment" "failed" reason=error %}', error="sha256 <mismatch>")

    assert html == (
        '<span class="badge" data-tone="bad" data-state="failed" title="sha256 &lt;mismatch&gt;">'
        '<span class="badge-icon" aria-hidden="true">✕</span> Failed</span>'
    )


def test_a_badge_built_in_python_renders_the_same_way() -> None:
    html = render("{% badge row_badge %}", row_badge=badges.target("draining", in_flight=3))

    assert 'data-tone="warn" data-state="draining"' in html
    assert "◐</span> Draining (3 in flight)</span>" in html


@pytest.mark.parametrize(
    ("kind", "values"),
    [
        ("target", [{"state": v.value} for v in TargetState]),
        ("health", [{"state": v.value} for v in TargetHealth]),
        ("route", [{"state": v} for v in RouteState.values]),
        ("revision", [{"state": v} for v in RevisionState.values]),
        ("deployment", [{"state": v} for v in [*NodeState.values, *DeploymentState.values]]),
        ("token", [{"state": v} for v in TokenStatus.values]),
        ("scale", [{"state": v.value} for v in ScaleOutcome]),
        ("outcome", [{"state": v} for v in RoutingOutcome.values]),
    ],
)
def test_every_stored_state_has_a_badge(kind: str, values: list[dict[str, str]]) -> None:
    for value in values:
        assert badges.build(kind, value["state"]).label


def test_every_nodes_trust_and_status_and_every_services_lifecycle_have_a_badge() -> None:
    for trust in NodeTrust.values:
        for status in NodeStatus.values:
            assert badges.node(trust, status).label
    for lifecycle in ServiceLifecycle.values:
        assert badges.service(lifecycle, ready=1, desired=2).label


def test_a_copy_button_says_what_it_copies() -> None:
    html = render('{% copy_button "@pool/chat" what="the model name" %}')

    assert html == (
        '<button type="button" class="copy" data-copy="@pool/chat" '
        'aria-label="Copy the model name">Copy</button>'
    )


def test_a_code_block_shows_its_code_as_written_with_a_copy_button() -> None:
    html = render(
        '{% code_block language="sh" %}echo "<hi>" {{ word }}{% endcode_block %}', word="&"
    )

    assert html == (
        '<figure class="code-block"><pre><code data-language="sh">echo "<hi>" &amp;</code></pre>'
        '<button type="button" class="copy" data-copy-code>Copy</button></figure>'
    )


def test_an_empty_state_offers_its_next_step_only_when_given() -> None:
    with_action = render(
        '{% empty_state "No pools yet" "Add one." action_url="/add/" action_label="Add pool" %}'
    )
    without = render('{% empty_state "No pools yet" "A staff member adds them." %}')

    assert '<a class="button primary" href="/add/">Add pool</a>' in with_action
    assert "<a " not in without
    assert '<p class="empty-title">No pools yet</p>' in without


def test_a_card_is_marked_out_of_band_when_rendered_for_a_push() -> None:
    page = render('{% card title="Targets" id="targets" %}<p>x</p>{% endcard %}')
    pushed = render('{% card title="Targets" id="targets" oob=True %}<p>x</p>{% endcard %}')

    assert page.startswith('<section class="card" id="targets" aria-labelledby="targets-title">')
    assert pushed.startswith('<section class="card" id="targets" hx-swap-oob="true"')
    assert '<h2 id="targets-title">Targets</h2>' in pushed


def test_tabs_select_the_first_and_label_each_panel_by_its_tab() -> None:
    html = render(
        '{% tabs id="params" label="Runtime parameters" %}'
        '{% tab "vLLM" %}one{% endtab %}{% tab "llama.cpp" %}two{% endtab %}{% endtabs %}'
    )

    assert (
        '<button type="button" role="tab" id="params-vllm-tab" aria-controls="params-vllm" '
        'aria-selected="true">vLLM</button>'
    ) in html
    assert 'aria-controls="params-llamacpp" aria-selected="false" tabindex="-1">' in html
    assert '<div class="tab-panel" role="tabpanel" id="params-vllm"' in html
    # Every panel shows without JavaScript; nexus.js then shows the selected one only.
    assert 'aria-labelledby="params-llamacpp-tab">two</div>' in html


def test_a_confirmation_dialog_posts_with_its_csrf_token_and_cancels_without_a_request() -> None:
    html = render(
        '{% confirm_dialog id="delete" title="Delete chat?" action="/x/delete/" '
        'confirm="Delete service" %}1 live route stops.{% endconfirm_dialog %}',
        csrf_token="the-token",
    )

    assert '<dialog class="dialog" id="delete" aria-labelledby="delete-title">' in html
    assert '<div class="dialog-body">1 live route stops.</div>' in html
    assert '<form method="dialog"><button type="submit" class="button" autofocus>Cancel' in html
    assert '<form method="post" action="/x/delete/">' in html
    assert 'name="csrfmiddlewaretoken" value="the-token"' in html


def test_a_drawer_has_a_body_to_fill_and_a_close_button() -> None:
    html = render('{% drawer id="route" title="Route 12" %}body{% enddrawer %}')

    assert '<dialog class="drawer" id="route" aria-labelledby="route-title">' in html
    assert '<div class="drawer-body" id="route-body">body</div>' in html
    assert 'data-close aria-label="Close Route 12"' in html


def test_the_live_socket_and_out_of_band_marks() -> None:
    assert render('{% live_socket "deployments" 12 %}') == (
        'hx-ext="ws" ws-connect="/ws/deployments/12/" data-live'
    )
    assert render('<p id="x"{% oob %}>', oob=True) == '<p id="x" hx-swap-oob="true">'
    assert render('<p id="x"{% oob %}>') == '<p id="x">'


def test_the_snippets_call_this_server_with_the_model_and_a_token_placeholder() -> None:
    request = RequestFactory().get("/pools/chat/", HTTP_HOST="localhost:8000")
    token = ApiToken(name="ci", prefix="nx-AbCdEfG")

    html = render('{% api_snippets "@pool/chat" tokens=tokens %}', request=request, tokens=[token])

    assert "curl -N http://localhost:8000/v1/chat/completions" in html
    assert "Bearer <span data-snippet-token>$NEXUS_TOKEN</span>" in html
    assert '"model": "@pool/chat"' in html
    assert 'OpenAI(base_url="http://localhost:8000/v1"' in html
    assert '<option value="nx-AbCdEfG…">ci (nx-AbCdEfG…): paste its secret</option>' in html


@pytest.mark.django_db
def test_the_navigation_marks_the_current_area_and_shows_missing_ones_as_soon(
    client: Client,
) -> None:
    client.force_login(make_user("teammate"))
    page = client.get("/serving/models/").content.decode()

    assert '<a href="/serving/models/" aria-current="page">Model folders</a>' in page
    assert '<a href="/serving/services/">Services</a>' in page
    assert '<a href="/tokens/">Tokens</a>' in page
    assert '<a href="/store/">Model store</a>' in page
    assert '<a href="/history/">History</a>' in page
    assert '<a href="/live/">Live</a>' in page
    for name in ["Projects"]:
        assert f'<span class="soon" aria-disabled="true">{name} <small' in page
    assert "UI kit" not in page  # staff only


def test_a_chart_sends_its_columns_and_a_push_replaces_them_by_id() -> None:
    chart = charts.time_series("rps", "Requests", "req/s", [1.0, 2.0], [("fast", [3.0, None])])

    page = render("{% time_chart chart %}", chart=chart)
    pushed = render("{% chart_data chart %}", chart=chart, oob=True)

    assert '<figure class="chart" id="rps" data-chart>' in page
    assert '<span class="chart-unit">req/s</span>' in page
    data = json.loads(page.split('data-chart-data="')[1].split('"', 1)[0].replace("&quot;", '"'))
    assert data == {
        "id": "rps",
        "title": "Requests",
        "unit": "req/s",
        "series": [{"label": "fast", "tone": "info"}],
        "columns": [[1.0, 2.0], [3.0, None]],
    }
    assert pushed.startswith('<div id="rps-data" data-chart-data="')
    assert pushed.endswith(' hidden hx-swap-oob="true"></div>')


def test_a_bar_chart_is_drawn_from_widths_computed_in_python() -> None:
    chart = charts.share_chart("Requests per target", [("fast", 84), ("medium", 41), ("slow", 15)])

    html = render("{% bar_chart chart %}", chart=chart)

    assert [bar.width for bar in chart.bars] == [60.0, 29.3, 10.7]
    assert [bar.text for bar in chart.bars] == ["60 % · 84", "29 % · 41", "11 % · 15"]
    assert '<rect class="bar" x="26.0%" y="7" width="32.4%" height="14" rx="3"></rect>' in html
    assert "<title>slow: 11 % · 15</title>" in html
    assert 'height="84"' in html


def test_a_chart_refuses_columns_that_do_not_line_up() -> None:
    with pytest.raises(ValueError, match="series 'fast' of chart 'rps' has 1 values for 2 times"):
        charts.time_series("rps", "Requests", "req/s", [1.0, 2.0], [("fast", [3.0])])
    with pytest.raises(ValueError, match="unit 'rps' is not one of"):
        charts.time_series("rps", "Requests", "rps", [1.0], [("fast", [3.0])])


def test_moments_render_in_utc_whatever_their_zone() -> None:
    when = datetime(2025, 1, 2, 13, 4, 5, tzinfo=UTC)

    assert render("{{ when|absolute }}", when=when) == "2025-01-02 13:04:05 UTC"
