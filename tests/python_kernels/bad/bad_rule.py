import lattn
plugin = lattn.Plugin("bad_rule")


@plugin.impl("scan", rules=["additive", "hebbian"])
def scan(case, t):
    pass
