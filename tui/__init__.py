"""memtop's terminal UI and command line. The only package that imports Textual."""
