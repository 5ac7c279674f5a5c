"""A float64 numpy port of the CUDA kernels' index logic (kernels/cuda/chunked.cu, scan.cu and
sliding_window.cu: its query / key blocks, window ranges, masks and online softmax).

No GPU is needed: each kernel's loops over column slices, chunks, staged row blocks and 16 x 16
tiles (with the causal skips, the zero padding, the gamma-power indices and the operand swaps of
the dq and dk passes) are transcribed loop for loop, and the results are held to a direct float64
implementation of SPEC section 1. Buffers start as NaN, so a read of anything the kernel did not
write shows. It checks the algebra and the indexing, not CUDA itself (WMMA layouts, barriers,
races): that is what lattn_cuda_tests and compute-sanitizer do on a GPU. Keep it in step with the
.cu files when their loops change.
"""

import unittest

import numpy as np

kSlice=64
def r16(x): return (x+15)//16*16

def stage(dst, src, D, col0, valid_rows, rows, width):
    dst[:rows,:width]=0
    vr=min(valid_rows,rows)
    w=max(0,min(width, D-col0))
    dst[:vr,:w]=src[:vr, col0:col0+w]

def setup(s0, trans, D, Dp, jw, col0, gamma, Cp):
    pw=np.array([gamma**k for k in range(Cp+1)])
    Sf=np.full((Dp,kSlice),np.nan)
    for r in range(Dp):
        for c in range(jw):
            col=col0+c
            v=0.0
            if r<D and col<D: v = s0[col,r] if trans else s0[r,col]
            Sf[r,c]=v
    return pw,Sf

def fwd_kernel(A,B,X,s0,trans,C,RB,gamma,scale,final):
    T,D=A.shape; Cp,Dp=r16(C),r16(D); out=np.full((T,D),np.nan); fin=np.full((D,D),np.nan)
    for js in range((Dp+kSlice-1)//kSlice):
        col0=js*kSlice; jw=min(kSlice,Dp-col0); ntj=jw//16; ntd=Dp//16
        pw,Sf=setup(s0,trans,D,Dp,jw,col0,gamma,Cp)
        Bf=np.full((Cp,Dp),np.nan); Ar=np.full((RB,Dp),np.nan); Xs=np.full((Cp,kSlice),np.nan); Ps=np.full((RB,Cp),np.nan)
        for c0 in range(0,T,C):
            n=min(C,T-c0); nt=(n+15)//16
            stage(Bf,B[c0:],D,0,n,nt*16,Dp); stage(Xs,X[c0:],D,col0,n,nt*16,jw)
            for r0 in range(0,nt*16,RB):
                rows=min(RB,nt*16-r0); nti=rows//16; g0=r0//16
                stage(Ar,A[c0+r0:],D,0,n-r0,rows,Dp)
                for t in range(nti*(g0+nti)):
                    ti=t//(g0+nti); tj=t-ti*(g0+nti)
                    if tj>g0+ti: continue
                    acc=np.zeros((16,16))
                    for k in range(ntd):
                        acc+=Ar[ti*16:ti*16+16,k*16:k*16+16]@Bf[tj*16:tj*16+16,k*16:k*16+16].T
                    for e in range(256):
                        r,c=e>>4,e&15; i=r0+ti*16+r; j=tj*16+c
                        v=acc[r,c]*pw[i-j]*scale if (j<=i and i<n) else 0.0
                        Ps[ti*16+r,j]=v
                for t in range(nti*ntj):
                    ti=t//ntj; tj=t-ti*ntj
                    acc=np.zeros((16,16))
                    for k in range(ntd):
                        acc+=Ar[ti*16:ti*16+16,k*16:k*16+16]@Sf[k*16:k*16+16,tj*16:tj*16+16]
                    for e in range(256):
                        r,c=e>>4,e&15; i=r0+ti*16+r
                        acc[r,c]*=scale*pw[i+1]
                    for k in range(g0+ti+1):
                        acc+=Ps[ti*16:ti*16+16,k*16:k*16+16]@Xs[k*16:k*16+16,tj*16:tj*16+16]
                    for e in range(256):
                        r,c=e>>4,e&15; i=r0+ti*16+r; col=col0+tj*16+c
                        if i<n and col<D: out[c0+i,col]=acc[r,c]
            for j in range(n): Bf[j,:]*=pw[n-1-j]
            Sf[:Dp,:jw]*=pw[n]
            for t in range(ntd*ntj):
                ti=t//ntj; tj=t-ti*ntj
                acc=Sf[ti*16:ti*16+16,tj*16:tj*16+16].copy()
                for k in range(nt):
                    acc+=Bf[k*16:k*16+16,ti*16:ti*16+16].T@Xs[k*16:k*16+16,tj*16:tj*16+16]
                Sf[ti*16:ti*16+16,tj*16:tj*16+16]=acc
        if final:
            for r in range(D):
                for c in range(jw):
                    if col0+c<D: fin[r,col0+c]=Sf[r,c]
    return out,fin

def bwd_kernel(A,B,X,s0,trans,C,RB,gamma,scale,final):
    T,D=A.shape; Cp,Dp=r16(C),r16(D); out=np.full((T,D),np.nan); fin=np.full((D,D),np.nan)
    for js in range((Dp+kSlice-1)//kSlice):
        col0=js*kSlice; jw=min(kSlice,Dp-col0); ntj=jw//16; ntd=Dp//16
        pw,Sf=setup(s0,trans,D,Dp,jw,col0,gamma,Cp)
        Af=np.full((Cp,Dp),np.nan); Br=np.full((RB,Dp),np.nan); Gs=np.full((Cp,kSlice),np.nan); Ps=np.full((RB,Cp),np.nan)
        chunks=(T+C-1)//C
        for ch in range(chunks-1,-1,-1):
            c0=ch*C; n=min(C,T-c0); nt=(n+15)//16
            stage(Af,A[c0:],D,0,n,nt*16,Dp); stage(Gs,X[c0:],D,col0,n,nt*16,jw)
            for r0 in range(0,nt*16,RB):
                rows=min(RB,nt*16-r0); nti=rows//16; g0=r0//16
                stage(Br,B[c0+r0:],D,0,n-r0,rows,Dp)
                for t in range(nti*nt):
                    tj=t//nt; ti=t-tj*nt
                    if ti<g0+tj: continue
                    acc=np.zeros((16,16))
                    for k in range(ntd):
                        acc+=Br[tj*16:tj*16+16,k*16:k*16+16]@Af[ti*16:ti*16+16,k*16:k*16+16].T
                    for e in range(256):
                        r,c=e>>4,e&15; j=r0+tj*16+r; i=ti*16+c
                        v=acc[r,c]*pw[i-j]*scale if (j<=i and i<n) else 0.0
                        Ps[tj*16+r,i]=v
                for t in range(nti*ntj):
                    tj=t//ntj; tv=t-tj*ntj
                    acc=np.zeros((16,16))
                    for k in range(ntd):
                        acc+=Br[tj*16:tj*16+16,k*16:k*16+16]@Sf[k*16:k*16+16,tv*16:tv*16+16]
                    for e in range(256):
                        r,c=e>>4,e&15; j=r0+tj*16+r
                        acc[r,c]*= pw[n-1-j] if j<n else 0.0
                    for k in range(g0+tj,nt):
                        acc+=Ps[tj*16:tj*16+16,k*16:k*16+16]@Gs[k*16:k*16+16,tv*16:tv*16+16]
                    for e in range(256):
                        r,c=e>>4,e&15; j=r0+tj*16+r; col=col0+tv*16+c
                        if j<n and col<D: out[c0+j,col]=acc[r,c]
            for i in range(n): Af[i,:]*=scale*pw[i+1]
            Sf[:Dp,:jw]*=pw[n]
            for t in range(ntd*ntj):
                ti=t//ntj; tv=t-ti*ntj
                acc=Sf[ti*16:ti*16+16,tv*16:tv*16+16].copy()
                for k in range(nt):
                    acc+=Af[k*16:k*16+16,ti*16:ti*16+16].T@Gs[k*16:k*16+16,tv*16:tv*16+16]
                Sf[ti*16:ti*16+16,tv*16:tv*16+16]=acc
        if final:
            for r in range(D):
                for c in range(jw):
                    if col0+c<D: fin[r,col0+c]=Sf[r,c]
    return out,fin

def scan_kernel(row,col,query,s0,trans,reverse,alpha,beta,gamma,final_gamma):
    T,D=row.shape; S=(s0.T if trans else s0).copy(); out=np.zeros((T,D))
    for u in range(T):
        t=T-1-u if reverse else u
        decay=1.0 if (reverse and u==0) else gamma
        S=decay*S+alpha*np.outer(row[t],col[t])
        out[t]=beta*(S.T@query[t])
    return out,(gamma if final_gamma else 1.0)*S

def reference(q,k,v,h0,dO,dhT,gamma):
    T,D=q.shape; s=D**-0.5; S=h0.copy(); Ss=[]; o=np.zeros((T,D))
    for t in range(T):
        S=gamma*S+np.outer(k[t],v[t]); Ss.append(S.copy()); o[t]=s*S.T@q[t]
    hT=S
    G=dhT.copy(); dq=np.zeros((T,D)); dk=np.zeros((T,D)); dv=np.zeros((T,D))
    for t in range(T-1,-1,-1):
        G=(G if t==T-1 else gamma*G)+s*np.outer(q[t],dO[t])
        dq[t]=s*Ss[t]@dO[t]; dk[t]=G@v[t]; dv[t]=G.T@k[t]
    dh0=gamma*G
    return o,hT,dq,dk,dv,dh0

def rel(x, r):
    return np.linalg.norm(x - r) / np.linalg.norm(r)


SHAPES = [(1, 1, 4, 1.0), (9, 1, 4, 0.97), (20, 8, 64, 0.97), (100, 16, 32, 0.97), (64, 5, 16, 1.0),
          (37, 12, 1, 0.97), (300, 128, 128, 0.97), (45, 100, 16, 0.97), (70, 65, 48, 0.9), (130, 20, 100, 0.95)]


class CudaEmulationTest(unittest.TestCase):
    def test_chunked_and_scan_passes_match_the_reference(self):
        rng = np.random.default_rng(0)
        for T, D, C, gamma in SHAPES:
            q, k, v, dO = [rng.standard_normal((T, D)) for _ in range(4)]
            h0, dhT = [rng.standard_normal((D, D)) for _ in range(2)]
            ref = reference(q, k, v, h0, dO, dhT, gamma)
            s = D ** -0.5
            Ce = min(C, T)
            for RB in sorted({min(64, r16(Ce)), 16}):
                with self.subTest(impl="chunked", T=T, D=D, C=C, gamma=gamma, RB=RB):
                    o, hT = fwd_kernel(q, k, v, h0, False, Ce, RB, gamma, s, True)
                    dq, _ = fwd_kernel(dO, v, k, h0, True, Ce, RB, gamma, s, False)
                    dv, dh0 = bwd_kernel(q, k, dO, dhT, False, Ce, RB, gamma, s, True)
                    dk, _ = bwd_kernel(dO, v, q, dhT, True, Ce, RB, gamma, s, False)
                    for name, x, r in zip(("o", "hT", "dq", "dk", "dv", "dh0"), (o, hT, dq, dk, dv, dh0), ref):
                        self.assertLess(rel(x, r), 1e-12, name)
            with self.subTest(impl="scan", T=T, D=D, gamma=gamma):
                so, shT = scan_kernel(k, v, q, h0, False, False, 1, s, gamma, False)
                sdq, _ = scan_kernel(v, k, dO, h0, True, False, 1, s, gamma, False)
                sdv, sdh0 = scan_kernel(q, dO, k, dhT, False, True, s, 1, gamma, True)
                sdk, _ = scan_kernel(dO, q, v, dhT, True, True, s, 1, gamma, False)
                for name, x, r in zip(("o", "hT", "dq", "dk", "dv", "dh0"), (so, shT, sdq, sdk, sdv, sdh0), ref):
                    self.assertLess(rel(x, r), 1e-12, name)


# ---- sliding-window attention (kernels/cuda/sliding_window.cu) ----
# Blocks of Bt query / key rows, Dh padded to Dp; shared tiles start as NaN and are staged with
# zero padding; the tile products run over the whole padded Bt x Bt / Bt x Dp tiles (as the warps'
# 16 x 16 tiles cover them). W is clamped to T as the launcher does.

def in_window(t, tau, T, W): return t < T and tau <= t and tau > t - W

def window_mask(q0, k0, Bt, T, W):
    return np.array([[in_window(q0 + r, k0 + c, T, W) for c in range(Bt)] for r in range(Bt)])

def swa_forward_kernel(q, k, v, W, Bt):
    T, D = q.shape; Dp = r16(D); W = min(W, T); s = D ** -0.5
    o = np.full((T, D), np.nan); lse = np.full(T, np.nan)
    for q0 in range(0, T, Bt):                       # blockIdx.y
        Qs, Ks, Vs = (np.full((Bt, Dp), np.nan) for _ in range(3))
        stage(Qs, q[q0:], D, 0, min(Bt, T - q0), Bt, Dp)
        Oacc = np.zeros((Bt, Dp)); m = np.full(Bt, -np.inf); l = np.zeros(Bt)
        q_last = min(q0 + Bt, T) - 1
        for k0 in range(max(0, q0 - W + 1) // Bt * Bt, q_last + 1, Bt):
            valid = min(Bt, T - k0)
            stage(Ks, k[k0:], D, 0, valid, Bt, Dp); stage(Vs, v[k0:], D, 0, valid, Bt, Dp)
            Sf = Qs @ Ks.T
            P = np.full((Bt, Bt), np.nan)
            mask = window_mask(q0, k0, Bt, T, W)
            for r in range(Bt):                       # one warp per row
                sv = np.where(mask[r], Sf[r] * s, -np.inf)
                m_new = max(m[r], sv.max()); m_use = 0.0 if m_new == -np.inf else m_new
                e = np.exp(sv - m_use); alpha = np.exp(m[r] - m_use)
                P[r] = e; Oacc[r] *= alpha
                m[r] = m_new; l[r] = l[r] * alpha + e.sum()
            Oacc += P @ Vs
        for r in range(min(Bt, T - q0)):
            o[q0 + r] = Oacc[r, :D] / l[r]; lse[q0 + r] = m[r] + np.log(l[r])
    return o, lse

def swa_backward_kernels(q, k, v, dO, o, lse, W, Bt):
    T, D = q.shape; Dp = r16(D); W = min(W, T); s = D ** -0.5
    delta = np.full(T, np.nan)
    for t in range(T): delta[t] = dO[t] @ o[t]                 # swa_delta_kernel
    def stage_queries(q0):
        Qs, dOs = np.full((Bt, Dp), np.nan), np.full((Bt, Dp), np.nan); valid = min(Bt, T - q0)
        stage(Qs, q[q0:], D, 0, valid, Bt, Dp); stage(dOs, dO[q0:], D, 0, valid, Bt, Dp)
        Lr = np.array([lse[q0 + r] if r < valid else 0.0 for r in range(Bt)])
        Dr = np.array([delta[q0 + r] if r < valid else 0.0 for r in range(Bt)])
        return Qs, dOs, Lr, Dr
    def stage_keys(k0):
        Ks, Vs = np.full((Bt, Dp), np.nan), np.full((Bt, Dp), np.nan); valid = min(Bt, T - k0)
        stage(Ks, k[k0:], D, 0, valid, Bt, Dp); stage(Vs, v[k0:], D, 0, valid, Bt, Dp)
        return Ks, Vs
    dq, dk, dv = (np.full((T, D), np.nan) for _ in range(3))
    for k0 in range(0, T, Bt):                                  # swa_dkv_kernel
        Ks, Vs = stage_keys(k0); dKacc = np.zeros((Bt, Dp)); dVacc = np.zeros((Bt, Dp))
        k_last = min(k0 + Bt, T) - 1
        for q0 in range(k0, min(T - 1, k_last + W - 1) + 1, Bt):
            Qs, dOs, Lr, Dr = stage_queries(q0)
            Sf = Qs @ Ks.T
            with np.errstate(over="ignore"):
                P = np.where(window_mask(q0, k0, Bt, T, W), np.exp(Sf * s - Lr[:, None]), 0.0)
            dVacc += P.T @ dOs
            dPf = dOs @ Vs.T
            dS = P * (dPf - Dr[:, None])
            dKacc += dS.T @ Qs
        for r in range(min(Bt, T - k0)):
            dk[k0 + r] = s * dKacc[r, :D]; dv[k0 + r] = dVacc[r, :D]
    for q0 in range(0, T, Bt):                                  # swa_dq_kernel
        Qs, dOs, Lr, Dr = stage_queries(q0); dQacc = np.zeros((Bt, Dp))
        for k0 in range(max(0, q0 - W + 1) // Bt * Bt, min(q0 + Bt, T), Bt):
            Ks, Vs = stage_keys(k0)
            Sf = Qs @ Ks.T; dPf = dOs @ Vs.T
            with np.errstate(over="ignore"):
                P = np.where(window_mask(q0, k0, Bt, T, W), np.exp(Sf * s - Lr[:, None]), 0.0)
            dQacc += (P * (dPf - Dr[:, None])) @ Ks
        for r in range(min(Bt, T - q0)):
            dq[q0 + r] = s * dQacc[r, :D]
    return dq, dk, dv

def swa_reference(q, k, v, dO, W):
    """Direct float64 SPEC section 2 window attention and the analytic gradients of <O, dO>."""
    T, D = q.shape; s = D ** -0.5
    o = np.zeros((T, D)); lse = np.zeros(T); dq, dk, dv = (np.zeros((T, D)) for _ in range(3))
    for t in range(T):
        lo = max(0, t - W + 1); S = s * k[lo:t + 1] @ q[t]
        m = S.max(); p = np.exp(S - m); l = p.sum(); p /= l
        o[t] = p @ v[lo:t + 1]; lse[t] = m + np.log(l)
        dS = p * (v[lo:t + 1] @ dO[t] - dO[t] @ o[t])
        dq[t] = s * dS @ k[lo:t + 1]; dk[lo:t + 1] += s * np.outer(dS, q[t]); dv[lo:t + 1] += np.outer(p, dO[t])
    return o, lse, dq, dk, dv

SWA_SHAPES = [(37, 64, 1), (50, 32, 1000), (64, 16, 64), (100, 64, 17), (70, 1, 8), (130, 128, 40),
              (300, 20, 100), (257, 48, 64), (5, 3, 2), (1, 7, 1), (150, 8, 34), (200, 8, 66)]


class CudaSlidingWindowEmulationTest(unittest.TestCase):
    def test_sliding_window_kernels_match_the_reference(self):
        rng = np.random.default_rng(1)
        for T, D, W in SWA_SHAPES:
            q, k, v, dO = [rng.standard_normal((T, D)) for _ in range(4)]
            ref = swa_reference(q, k, v, dO, W)
            for Bt in (16, 32, 64):
                with self.subTest(T=T, D=D, W=W, Bt=Bt):
                    o, lse = swa_forward_kernel(q, k, v, W, Bt)
                    dq, dk, dv = swa_backward_kernels(q, k, v, dO, o, lse, W, Bt)
                    for name, x, r in zip(("o", "lse", "dq", "dk", "dv"), (o, lse, dq, dk, dv), ref):
                        self.assertTrue(np.all(np.isfinite(x)), name)
                        err = np.abs(x - r).max() / max(np.abs(r).max(), 1.0)
                        self.assertLess(err, 1e-12, name)


if __name__ == "__main__":
    unittest.main()
