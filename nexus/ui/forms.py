"""Every page form renders with the kit's templates (docs/ui.md, "Forms")."""

from __future__ import annotations

from django.forms.renderers import TemplatesSetting


class FormRenderer(TemplatesSetting):
    """Render `{{ form }}` as templates/ui/forms/: each field's errors beside it, values kept."""

    form_template_name = "ui/forms/form.html"
    field_template_name = "ui/forms/field.html"
