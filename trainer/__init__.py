"""memtop trainer: a nanoGPT-style mini-GPT and its AMP training loop. Imports no Textual."""
