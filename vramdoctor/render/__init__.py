"""Faces shared by every command: the terminal (`console`) and charts (`charts`). Never measures.

Each command's own report (sentences, tables, JSON) lives with the command (`soak.report`,
`diagnose.report`, ...) and renders through these.
"""

# A namespace of modules: import what you need from them (e.g. vramdoctor.render.console).
__all__: list[str] = []
