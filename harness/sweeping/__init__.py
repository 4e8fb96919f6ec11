"""Sweeps: ``sweep.py`` reads a spec into points, ``sweeprun.py`` carries them out
(resumable), ``sweepcsv.py`` joins their summaries into sweep.csv, ``figures.py``
draws the figures."""
