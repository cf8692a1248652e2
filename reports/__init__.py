"""Rendering for people: Jinja2 templates (StrictUndefined) over plain dicts, never JSON by template."""
