"""Service pages: the list with its tabs, the launcher that checks as one types, the service's
page with its revisions, routes and tokens, scaling, clearing errors and deleting."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from nexus.models import ApiToken, hash_token
from serving import folders, services
from serving.forms import form_data_of
from serving.models import Revision, Route, RouteState, Service, ServiceLifecycle
from tests.deployments.factories import make_node
from tests.nexus.factories import make_user
from tests.serving.test_services_api import make_folder, make_service
from tests.support.personas import default_viewer

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("data_dir")]

LIST = "/serving/services/"
NEW = "/serving/services/new/"
CHECK = "/serving/services/new/check/"
FIELDS = "/serving/services/new/fields/"
HTMX = {"HTTP_HX_REQUEST": "true"}
BROKEN_DEFINITION = (
    "models:\n  - name: x\n    model_path: /models\n    service:\n      port: 8000\n"
)


@pytest.fixture
def staff() -> Client:
    client = Client()
    client.force_login(make_user("owner", staff=True))
    return client


@pytest.fixture
def member() -> Client:
    client = Client()
    client.force_login(default_viewer("teammate"))
    return client


def launcher(**overrides: str) -> dict[str, str]:
    """Return the launcher's form for a vLLM service on llama, with overrides."""
    return {
        "name": "chat",
        "model_folder": "llama",
        "runtime_variant": "vllm",
        "mount_destination": "/models",
        "desired_replicas": "1",
        "resource_group": "default",
        "preset": "cpu-small",
        **overrides,
    }


def text(response: Any) -> str:
    return response.content.decode()


# The list


def test_the_list_shows_active_services_with_their_readiness(member: Client) -> None:
    service = make_service("chat", desired_replicas=2, open_to_public=True)
    Route.objects.create(
        service=service, revision=service.latest_revision, state=RouteState.HEALTHY
    )
    gone = make_service("old")
    Service.objects.filter(pk=gone.pk).update(lifecycle=ServiceLifecycle.DESTROYED)

    page = text(member.get(LIST))

    assert 'href="/serving/services/chat/"' in page
    assert "1 of 2 replicas ready" in page
    assert "<td>vllm</td>" in page
    assert "/serving/services/old/" not in page
    assert "Start service" not in page


def test_the_destroyed_tab_shows_only_destroyed_services(staff: Client) -> None:
    make_service("chat")
    gone = make_service("old")
    Service.objects.filter(pk=gone.pk).update(lifecycle=ServiceLifecycle.DESTROYED)

    page = text(staff.get(LIST, {"tab": "destroyed"}))

    assert 'href="/serving/services/old/"' in page
    assert "/serving/services/chat/" not in page
    assert 'aria-current="page">Destroyed' in page


def test_an_empty_list_invites_staff_to_start_one(staff: Client) -> None:
    page = text(staff.get(LIST))

    assert "No services yet." in page
    assert f'href="{NEW}"' in page


def test_pages_need_a_sign_in() -> None:
    response = Client().get(LIST)

    assert response.status_code == 302
    assert response["Location"] == f"/login/?next={LIST}"


# The launcher


def test_the_launcher_offers_folders_variants_and_the_variants_variables(staff: Client) -> None:
    make_folder("llama")

    page = text(staff.get(NEW))

    assert '<option value="llama">llama</option>' in page
    assert '<option value="vllm" selected>vLLM</option>' in page
    assert 'name="env_VLLM_TP_SIZE"' in page
    assert 'hx-post="/serving/services/new/check/"' in page
    assert 'hx-trigger="keyup changed delay:300ms, change"' in page


@pytest.mark.parametrize(
    ("fields", "present", "absent"),
    [
        ({"runtime_variant": "sglang"}, ['name="env_SGLANG_TP_SIZE"'], ['name="env_VLLM_TP_SIZE"']),
        ({"runtime_variant": "custom"}, ['name="command"'], ['name="model_definition_path"']),
        (
            {"runtime_variant": "custom", "custom_mode": "definition"},
            ['name="model_definition_path"'],
            ['name="command"'],
        ),
        ({"runtime_variant": "modular-max"}, ["takes no variables of its own"], ["env_"]),
    ],
)
def test_the_fields_follow_the_variant(
    staff: Client, fields: dict[str, str], present: list[str], absent: list[str]
) -> None:
    fragment = text(staff.post(FIELDS, fields, **HTMX))

    assert fragment.lstrip().startswith('<div id="variant-fields"')
    for snippet in present:
        assert snippet in fragment
    for snippet in absent:
        assert snippet not in fragment


def test_the_check_lists_a_broken_command_by_its_field(staff: Client) -> None:
    make_folder("llama")

    fragment = text(
        staff.post(CHECK, launcher(runtime_variant="custom", command="vllm serve '/models"), **HTMX)
    )

    assert fragment.lstrip().startswith('<section class="card" id="launch-check"')
    assert "1 problem:" in fragment
    assert "<code>command</code>: unbalanced quote: a quote is opened and never closed" in fragment
    assert not Service.objects.exists()


def test_the_check_lists_a_broken_model_definition_by_file_and_key(staff: Client) -> None:
    make_folder("llama", **{"model-definition.yaml": BROKEN_DEFINITION})

    fragment = text(
        staff.post(CHECK, launcher(runtime_variant="custom", custom_mode="definition"), **HTMX)
    )

    assert "<code>model-definition.yaml: models[0].service.start_command</code>: required" in (
        fragment
    )


def test_the_check_shows_both_files_problems_at_once_beside_their_fields(staff: Client) -> None:
    toml = '[custom.resource_slots]\nmem = "lots"\n'
    make_folder(
        "llama", **{"model-definition.yaml": BROKEN_DEFINITION, "service-definition.toml": toml}
    )

    fragment = text(
        staff.post(CHECK, launcher(runtime_variant="custom", custom_mode="definition"), **HTMX)
    )

    assert "2 problems:" in fragment
    toml_problem = 'service-definition.toml: custom.resource_slots.mem: must be a size like "8gb"'
    yaml_problem = "model-definition.yaml: models[0].service.start_command: required"
    slot = '<small class="field-error" id="error-{}" hx-swap-oob="true" role="alert">{}'
    assert slot.format("model_folder", toml_problem.replace('"', "&quot;")) in fragment
    assert slot.format("model_definition_path", yaml_problem) in fragment


def test_the_check_takes_a_pasted_commands_health_path_and_timings(staff: Client) -> None:
    make_folder("llama")
    form = launcher(
        runtime_variant="custom",
        command="python -m http.server ${PORT} --directory /models",
        health_path="/",
        interval="1.5",
        initial_delay="2",
        max_retries="4",
    )

    fragment = text(staff.post(CHECK, form, **HTMX))
    refused = text(staff.post(CHECK, {**form, "command_port": "8002"}, **HTMX))
    no_interval = text(staff.post(CHECK, {**form, "interval": "0"}, **HTMX))

    assert "<code>/</code> every 1.5 s, first after 2.0 s, 4 retries" in fragment
    assert (
        '<small class="field-error" id="error-command_port" hx-swap-oob="true" role="alert">'
        "the command listens on ${PORT}, which the agent allocates; leave it empty"
    ) in refused
    assert (
        '<small class="field-error" id="error-interval" hx-swap-oob="true" role="alert">'
        "must be a number greater than 0"
    ) in no_interval


def test_the_check_shows_what_would_run(staff: Client) -> None:
    make_folder("llama")

    fragment = text(
        staff.post(
            CHECK,
            launcher(
                runtime_variant="custom", command="vllm serve /models/m --tp 2 --pp 3 --port 8001"
            ),
            **HTMX,
        )
    )

    assert "Ready to start." in fragment
    assert "<dt>Runtime</dt><dd>vllm (under custom)</dd>" in fragment
    assert "<dt>Port</dt><dd>8001</dd>" in fragment
    assert "<dt>Tensor parallel</dt><dd>2</dd>" in fragment
    assert "<dt>Pipeline parallel</dt><dd>3</dd>" in fragment
    assert "<code>/models/m</code>" in fragment
    assert "<dt>Resources</dt><dd>1 CPU, 1 GiB</dd>" in fragment


def test_the_check_reads_the_variants_variables(staff: Client) -> None:
    make_folder("llama")

    fragment = text(staff.post(CHECK, launcher(env_VLLM_TP_SIZE="two"), **HTMX))
    fixed = text(staff.post(CHECK, launcher(env_VLLM_TP_SIZE="4"), **HTMX))

    assert "<code>environ.VLLM_TP_SIZE</code>: must be a positive integer, not &#x27;two&#x27;" in (
        fragment
    )
    assert "<dt>Tensor parallel</dt><dd>4</dd>" in fixed
    assert "allocated by the agent" in fixed


def test_more_variables_are_read_one_per_line(staff: Client) -> None:
    make_folder("llama")

    good = text(staff.post(CHECK, launcher(variables="HF_HOME=/cache\n# note\n\nA=b=c"), **HTMX))
    bad = text(staff.post(CHECK, launcher(variables="HF_HOME"), **HTMX))

    assert "<code>HF_HOME=/cache</code>" in good
    assert "<code>A=b=c</code>" in good
    assert "<code>variables</code>: line 1: write NAME=value" in bad


def test_submitting_starts_the_service_and_shows_it(staff: Client) -> None:
    make_folder("llama")

    response = staff.post(NEW, launcher(env_VLLM_TP_SIZE="2", open_to_public="on"))

    assert response.status_code == 302
    assert response["Location"] == "/serving/services/chat/"
    service = Service.objects.get()
    assert (service.open_to_public, service.owner.username) == (True, "owner")
    assert service.latest_revision.environ == {"VLLM_TP_SIZE": "2"}
    assert service.latest_revision.resource_slots == {
        "cpu": 1.0,
        "mem": 1 << 30,
        "cuda.shares": 0.0,
    }


def test_submitting_a_custom_command_keeps_it(staff: Client) -> None:
    make_folder("llama")

    staff.post(
        NEW,
        launcher(
            runtime_variant="custom",
            custom_mode="command",
            command="python -m http.server --port ${PORT}",
            model_definition_path="ignored.yaml",
        ),
    )

    revision = Service.objects.get().latest_revision
    assert (revision.command, revision.model_definition_path) == (
        "python -m http.server --port ${PORT}",
        "",
    )


def test_a_refused_submission_lists_every_problem_and_creates_nothing(staff: Client) -> None:
    make_folder("llama")
    make_service("chat")

    response = staff.post(NEW, launcher(desired_replicas="99", env_VLLM_PP_SIZE="0"))

    assert response.status_code == 400
    page = text(response)
    assert "3 problems:" in page
    assert "<code>name</code>: a service named &#x27;chat&#x27; exists" in page
    assert "<code>desired_replicas</code>: must be between 0 and 64, not 99" in page
    assert (
        "<code>environ.VLLM_PP_SIZE</code>: must be a positive integer, not &#x27;0&#x27;" in page
    )
    assert (Service.objects.count(), Revision.objects.count()) == (1, 1)


def test_a_teammate_cannot_open_the_launcher(member: Client) -> None:
    assert member.get(NEW).status_code == 403
    assert member.post(CHECK, launcher()).status_code == 403


# The service's page


def test_the_page_shows_status_revisions_side_by_side_and_routes(staff: Client) -> None:
    service = make_service("chat", desired_replicas=2)
    Service.objects.filter(pk=service.pk).update(running_revision=service.latest_revision)
    services.update_service(service, environ={"VLLM_TP_SIZE": "2"})
    route = Route.objects.create(
        service=service,
        revision=Revision.objects.get(service=service, number=1),
        node=make_node("gpu-a"),
        port=41001,
        state=RouteState.FAILED_TO_START,
        errors=[{"at": "2026-01-01T00:00:00Z", "message": "exited with 1", "exit_code": 1}],
    )

    page = text(staff.get("/serving/services/chat/"))

    assert '<span id="service-readiness">0 of 2 replicas ready</span>' in page
    assert (
        "The next revision is being applied: revision 2 is rolling out while the replicas run "
        "revision 1." in page
    )
    assert 'data-dialog="current-revision">View current revision</a>' in page
    assert "Current revision: revision 1" in page
    assert "Latest: revision 2" in page
    assert "Running: revision 1" in page
    row = page[page.index(f'<tr id="route-{route.pk}" data-health="failed_to_start"') :]
    row = row.split("</tr>")[0]
    assert 'data-traffic="none"' in row
    assert f'data-dialog="route-errors-{route.pk}"' in row
    assert "⚠ 1 error" in row
    # The error indicator opens the route's errors as they are stored.
    assert "&quot;exit_code&quot;: 1" in row
    assert "exited with 1" in row
    assert f'action="/serving/services/chat/routes/{route.pk}/clear-errors/"' in page
    assert "Clear errors and retry" in page


def test_the_page_lists_the_services_tokens_with_their_state(member: Client) -> None:
    make_service("chat")
    ApiToken.issue("app", services=["chat"], expires_at=timezone.now() + timedelta(days=30))
    ApiToken.issue("old", services=["chat"], expires_at=timezone.now() - timedelta(days=1))
    revoked, _ = ApiToken.issue("gone", services=["chat", "other"])
    revoked.revoke()
    ApiToken.issue("elsewhere", services=["other"])
    ApiToken.issue("all pools")

    page = text(member.get("/serving/services/chat/"))

    tokens = page[page.index('id="tokens"') :]
    assert 'data-state="valid"' in tokens
    assert 'data-state="expired"' in tokens
    assert 'data-state="revoked"' in tokens
    assert "elsewhere" not in tokens
    assert "all pools" not in tokens


def test_staff_issue_a_token_whose_secret_is_shown_once(staff: Client) -> None:
    make_service("chat")

    last_day = (timezone.localdate() + timedelta(days=7)).isoformat()
    response = staff.post("/serving/services/chat/tokens/", {"name": "app", "expires_on": last_day})
    page = text(staff.get(response.headers["Location"]))
    later = text(staff.get("/serving/services/chat/"))

    # Redirected (POST/redirect/GET): reloading the page it shows issues no second token.
    assert (response.status_code, response.headers["Location"]) == (302, "/serving/services/chat/")
    assert ApiToken.objects.count() == 1
    token = ApiToken.objects.get()
    secret = page.split('<code id="issued-secret">')[1].split("</code>")[0]
    assert token.services == ["chat"]
    assert ApiToken.objects.filter(token_hash=hash_token(secret)).exists()
    assert "Copy it now: it is not shown again." in page
    # Through the end of the chosen day.
    assert (
        token.expires_at.isoformat() == f"{timezone.localdate() + timedelta(days=8)}T00:00:00+00:00"
    )
    assert secret not in later
    assert f'id="token-{token.pk}"' in later


def test_a_token_needs_a_name_and_a_day_after_today(staff: Client) -> None:
    make_service("chat")
    today = timezone.localdate().isoformat()

    response = staff.post(
        "/serving/services/chat/tokens/", {"name": "app", "expires_on": today}, follow=True
    )

    assert "Choose a day after today." in text(response)
    assert not ApiToken.objects.exists()


def test_staff_revoke_a_token(staff: Client) -> None:
    make_service("chat")
    token, _ = ApiToken.issue("app", services=["chat"], expires_at=timezone.now() + timedelta(1))
    other, _ = ApiToken.issue("other", services=["other"])

    response = staff.post(f"/serving/services/chat/tokens/{token.pk}/revoke/", follow=True)
    foreign = staff.post(f"/serving/services/chat/tokens/{other.pk}/revoke/")

    assert "Revoked token app." in text(response)
    token.refresh_from_db()
    other.refresh_from_db()
    assert token.is_revoked
    assert foreign.status_code == 404
    assert not other.is_revoked


def test_an_unknown_service_is_404(member: Client) -> None:
    assert member.get("/serving/services/nope/").status_code == 404


def test_staff_scale_a_service(staff: Client) -> None:
    make_service("chat")

    response = staff.post("/serving/services/chat/scale/", {"desired_replicas": "3"}, follow=True)
    refused = staff.post("/serving/services/chat/scale/", {"desired_replicas": "x"}, follow=True)

    assert "chat now keeps 3 replicas." in text(response)
    assert "Replicas: enter a whole number from 0 to 64." in text(refused)
    assert Service.objects.get().desired_replicas == 3


def test_staff_scale_to_one_replica_read_in_the_singular(staff: Client) -> None:
    make_service("chat", desired_replicas=2)

    response = staff.post("/serving/services/chat/scale/", {"desired_replicas": "1"}, follow=True)

    assert "chat now keeps 1 replica." in text(response)


def test_the_routes_card_shows_running_routes_and_the_finished_behind_a_toggle(
    staff: Client,
) -> None:
    service = make_service("chat")
    error = [{"at": "2026-01-01T00:00:00Z", "message": "exited with 1"}]
    finished = [
        Route.objects.create(
            service=service,
            revision=service.latest_revision,
            state=RouteState.TERMINATED,
            errors=error,
        )
        for _ in range(services.FINISHED_ROUTES_SHOWN + 5)
    ]
    running = Route.objects.create(service=service, revision=service.latest_revision)

    page = staff.get("/serving/services/chat/")
    toggled = staff.get("/serving/services/chat/?routes=finished")

    assert [row["route"].pk for row in page.context["routes"]] == [running.pk]
    assert "Finished (25)" in text(page)
    newest = [route.pk for route in reversed(finished)][: services.FINISHED_ROUTES_SHOWN]
    assert [row["route"].pk for row in toggled.context["routes"]] == newest
    assert "The 20 most recent of 25 finished routes." in text(toggled)
    # Nothing to retry on a terminated route: its replacement is the one retried.
    assert "Clear errors and retry" not in text(toggled)
    assert '<div id="routes-finished">' in text(toggled)


def test_clearing_a_terminated_routes_errors_is_refused(staff: Client) -> None:
    service = make_service("chat")
    route = Route.objects.create(
        service=service,
        revision=service.latest_revision,
        state=RouteState.TERMINATED,
        errors=[{"at": "2026-01-01T00:00:00Z", "message": "probe failed"}],
    )

    response = staff.post(f"/serving/services/chat/routes/{route.pk}/clear-errors/", follow=True)

    assert (
        f"Route {route.pk} was not retried: route {route.pk} is terminated; the route that "
        "replaced it is retried instead" in text(response)
    )
    route.refresh_from_db()
    assert len(route.errors) == 1


def test_clear_errors_and_retry_runs_the_definition_file_as_fixed_since(staff: Client) -> None:
    broken = "models:\n  - name: x\n    model_path: /models\n    service:\n"
    broken += "      start_command: [serve, --crash]\n      port: 8001\n"
    folder = make_folder("custom-model", **{"model-definition.yaml": broken})
    service = services.create_service(name="chat", model_folder=folder, runtime_variant="custom")
    route = Route.objects.create(
        service=service,
        revision=service.latest_revision,
        state=RouteState.FAILED_TO_START,
        errors=[{"at": "2026-01-01T00:00:00Z", "message": "exited with 1"}],
    )
    folders.write_file(
        folder, "model-definition.yaml", [broken.replace("--crash", "--fixed").encode()]
    )

    response = staff.post(f"/serving/services/chat/routes/{route.pk}/clear-errors/", follow=True)

    assert f"Cleared the errors of route {route.pk}; retrying it now." in text(response)
    service.refresh_from_db()
    assert service.latest_revision.number == 2
    assert service.latest_revision.spec["argv"] == ["serve", "--fixed"]
    route.refresh_from_db()
    assert route.errors == []


def test_the_revision_shows_the_service_definitions_image_and_variables(staff: Client) -> None:
    toml = '[vllm.environment]\nimage = "vllm/vllm-openai:v0.6.3"\narchitecture = "x86_64"\n'
    toml += '[vllm.environ]\nVLLM_TP_SIZE = "2"\n'
    make_folder("llama", **{"service-definition.toml": toml})
    service = make_service("chat")

    page = text(staff.get("/serving/services/chat/"))

    assert service.latest_revision.image == "vllm/vllm-openai:v0.6.3"
    assert "<code>vllm/vllm-openai:v0.6.3</code>" in page
    assert "<code>VLLM_TP_SIZE=2</code>" in page


def test_edit_opens_the_launcher_filled_in_from_the_latest_revision(staff: Client) -> None:
    make_service(
        "chat",
        environ={"VLLM_TP_SIZE": "2", "EXTRA": "1"},
        desired_replicas=2,
        preset="cpu-small",
        runtime_parameters={"dtype": "bfloat16"},
    )

    response = staff.get("/serving/services/chat/edit/")

    form = response.context["form"]
    assert response.status_code == 200
    assert (form["name"].value(), form["runtime_variant"].value()) == ("chat", "vllm")
    assert form["env_VLLM_TP_SIZE"].value() == "2"
    assert form["variables"].value() == "EXTRA=1"
    assert form["param_dtype"].value() == "bfloat16"
    assert (form["desired_replicas"].value(), form["preset"].value()) == ("2", "cpu-small")
    assert "Ready to update." in text(response)
    assert '<button type="submit" class="primary button">Update</button>' in text(response)


def test_update_makes_the_next_revision_only_when_the_launch_changes(staff: Client) -> None:
    service = make_service("chat", environ={"VLLM_TP_SIZE": "2"})
    data = form_data_of(service)

    same = staff.post("/serving/services/chat/edit/", data, follow=True)
    changed = staff.post(
        "/serving/services/chat/edit/", {**data, "env_VLLM_TP_SIZE": "4"}, follow=True
    )

    assert "Updated chat; its revision is unchanged." in text(same)
    assert "Updated chat: revision 2 rolls out." in text(changed)
    service.refresh_from_db()
    assert service.latest_revision.number == 2
    assert service.latest_revision.environ == {"VLLM_TP_SIZE": "4"}
    assert "Revision 2 is rolling out: its first replicas are starting." in text(changed)


def test_staff_clear_a_routes_errors(staff: Client) -> None:
    service = make_service("chat")
    route = Route.objects.create(
        service=service,
        revision=service.latest_revision,
        state=RouteState.UNHEALTHY,
        errors=[{"at": "2026-01-01T00:00:00Z", "message": "probe failed"}],
    )

    response = staff.post(f"/serving/services/chat/routes/{route.pk}/clear-errors/", follow=True)

    assert f"Cleared the errors of route {route.pk}; retrying it now." in text(response)
    route.refresh_from_db()
    assert route.errors == []


def test_deleting_asks_first_then_starts_destroying(staff: Client) -> None:
    make_service("chat")

    confirm = text(staff.get("/serving/services/chat/delete/"))
    response = staff.post("/serving/services/chat/delete/", follow=True)

    assert "Delete service chat?" in confirm
    assert "Destroying chat: its replicas are stopping." in text(response)
    assert Service.objects.get().lifecycle == ServiceLifecycle.DESTROYING
    assert "Delete service</a>" not in text(response)


def test_the_delete_confirmation_counts_only_live_routes_as_live(staff: Client) -> None:
    service = make_service("chat")
    for state in [RouteState.TERMINATED] * 11 + [RouteState.FAILED_TO_START]:
        Route.objects.create(service=service, revision=service.latest_revision, state=state)
    Route.objects.create(
        service=service, revision=service.latest_revision, state=RouteState.HEALTHY
    )

    confirm = text(staff.get("/serving/services/chat/delete/"))

    assert "1 live route stops taking requests" in confirm
    assert "12 finished routes are kept in its history" in confirm


def test_a_teammate_cannot_change_a_service(member: Client) -> None:
    make_service("chat")

    assert member.post("/serving/services/chat/scale/", {"desired_replicas": "3"}).status_code == (
        403
    )
    assert member.post("/serving/services/chat/delete/").status_code == 403
    assert Service.objects.get().desired_replicas == 1


# The Django admin


def test_the_admin_shows_services_with_their_revisions_and_routes(staff: Client) -> None:
    admin = Client()
    admin.force_login(make_user("root", superuser=True))
    service = make_service("chat")
    route = Route.objects.create(
        service=service,
        revision=service.latest_revision,
        state=RouteState.FAILED_TO_START,
        errors=[{"at": "2026-01-01T00:00:00Z", "message": "exited"}],
    )

    listing = text(admin.get("/admin/serving/service/"))
    change = text(admin.get(f"/admin/serving/service/{service.pk}/change/"))
    revisions = admin.get("/admin/serving/revision/")
    routes = admin.get("/admin/serving/route/")
    cleared = admin.post(
        "/admin/serving/route/",
        {"action": "clear_errors", "_selected_action": [route.pk]},
        follow=True,
    )

    assert "0 of 1 replica ready" in listing
    assert "chat r1" in change
    assert (revisions.status_code, routes.status_code) == (200, 200)
    assert "Cleared the errors of 1 route; retrying." in text(cleared)
    route.refresh_from_db()
    assert route.errors == []


def test_changing_replicas_in_the_admin_goes_through_the_checks(staff: Client) -> None:
    admin = Client()
    admin.force_login(make_user("root", superuser=True))
    service = make_service("chat")

    admin.post(
        f"/admin/serving/service/{service.pk}/change/",
        {
            "desired_replicas": "3",
            "open_to_public": "on",
            **{
                f"{prefix}-{key}": value
                for prefix in ("revisions", "routes")
                for key, value in (
                    ("TOTAL_FORMS", "0"),
                    ("INITIAL_FORMS", "0"),
                    ("MIN_NUM_FORMS", "0"),
                    ("MAX_NUM_FORMS", "1000"),
                )
            },
        },
    )

    service.refresh_from_db()
    assert (service.desired_replicas, service.open_to_public) == (3, True)
    assert Revision.objects.count() == 1
