"""Tasks: functions config -> summary row; every module here registers itself."""
