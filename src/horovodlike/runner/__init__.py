"""The launcher: `horovodlikerun` parses horovodrun's flags, assigns ranks to hosts, serves the
rendezvous, starts the ranks (locally or over ssh) and supervises them.

Entry point: `horovodlike.runner.launch.main`.
"""
