"""The console UI kit: formatting, state badges, charts and navigation (docs/ui.md)."""
