import lattn
plugin = lattn.Plugin("syntax"
