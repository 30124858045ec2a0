"""The lab fleet: real, isolated SSH hosts on this one machine."""
