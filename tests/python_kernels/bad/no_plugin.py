"""Declares nothing."""
import lattn
