"""Tests of the toolkit (`ws_mode.toolkit`): its commands, bench, reference server and shared
tools."""
