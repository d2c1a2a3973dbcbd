"""The Jupyter surface: the ``%transient_cluster`` magics and the live views (widgets, Bokeh)."""
