"""Export: what a run writes and serves costs nothing measurable and loses little: Prometheus
scraping a live run (in process and beside it), and the rows a kill -9 takes from metrics.jsonl.

Cases: metrics_scrape, kill9_loss.
"""
