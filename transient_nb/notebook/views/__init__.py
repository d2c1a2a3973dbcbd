"""Views of a run's event log: Bokeh figures, the notebook control panel, reports."""
