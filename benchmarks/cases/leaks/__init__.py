"""Leaks: the leak detector's false alarms and its delays to alert and to clear, the culprit
finder's pause by live objects, and the time-to-full forecast against the guard's stop.

Cases: leak_detection, culprit_pause, time_to_full.
"""
