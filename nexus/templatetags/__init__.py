"""Template tags of the console UI kit (`{% load ui %}`)."""
