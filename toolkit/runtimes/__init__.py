"""The runtimes an artifact runs on, seen from the host: sessions that run it (:mod:`.execution`), readers of
what is inside it (:mod:`.inspection`), and whether a device's runtime can load it (:mod:`.compat`).
"""
