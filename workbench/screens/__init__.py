"""The Textual UI of numawb: screens, widgets and their .tcss style sheets (UI only).

Widgets here read immutable telemetry snapshots and call the app's actions; only
``workbench.app`` talks to the engine.
"""
