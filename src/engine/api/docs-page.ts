/**
 * docsPage returns the offline API reference: one self-contained HTML page that reads
 * /api/openapi.json and renders every operation with its parameters, body and responses.
 * It loads nothing from a CDN, since a workstation may be offline.
 */
export function docsPage(version: string): string {
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>engine API ${escapeHtml(version)}</title>
<style>
:root{color-scheme:light dark;--b:#8884;--m:#888}
body{font:14px/1.45 system-ui,sans-serif;max-width:1000px;margin:2rem auto;padding:0 1rem}
h1{font-size:1.4rem}h2{margin-top:2rem;border-bottom:1px solid var(--b);text-transform:capitalize}
details{border:1px solid var(--b);border-radius:6px;margin:.4rem 0;padding:.3rem .6rem}
summary{cursor:pointer}code,pre{font:12px ui-monospace,monospace}pre{overflow:auto;background:#8881;padding:.5rem;border-radius:4px}
.m{display:inline-block;min-width:4.2rem;font-weight:700}.GET{color:#0a7}.POST{color:#27c}.PUT{color:#c80}.DELETE{color:#d33}
.muted{color:var(--m)}
</style></head><body>
<h1>engine API <span class="muted">${escapeHtml(version)}</span></h1>
<p>Every route takes <code>Authorization: Bearer &lt;token&gt;</code> unless marked public. Machine-readable contract: <a href="/api/openapi.json">/api/openapi.json</a>.</p>
<div id="ops">Loading…</div>
<script>
const esc=s=>String(s).replace(/[&<>"]/g,c=>({"&":"&amp;","<":"&lt;",">":"&gt;",'"':"&quot;"})[c]);
const pub=new Set(["/api/health","/api/ready","/api/openapi.json"]);
fetch("/api/openapi.json").then(r=>r.json()).then(doc=>{
  // Shared records are components behind a $ref: show them inline (a bounded number of hops).
  const ref=(s,d=0)=>s===null||typeof s!=="object"?s:Array.isArray(s)?s.map(x=>ref(x,d))
    :typeof s.$ref==="string"&&d<8?ref(doc.components?.schemas?.[decodeURIComponent(s.$ref.split("/").pop())]??s,d+1)
    :Object.fromEntries(Object.entries(s).map(([k,v])=>[k,ref(v,d)]));
  const byTag={};
  for(const [path,ops] of Object.entries(doc.paths||{}))for(const [method,op] of Object.entries(ops)){
    const tag=(op.tags||["other"])[0];(byTag[tag]??=[]).push({path,method:method.toUpperCase(),op});}
  let html="";
  for(const tag of Object.keys(byTag).sort()){
    html+="<h2>"+esc(tag)+"</h2>";
    for(const {path,method,op} of byTag[tag]){
      const params=(op.parameters||[]).map(p=>"<li><code>"+esc(p.in)+" "+esc(p.name)+"</code> "+esc(JSON.stringify(ref(p.schema)))+"</li>").join("");
      const body=ref(op.requestBody?.content?.["application/json"]?.schema);
      const responses=Object.entries(op.responses||{}).map(([s,r])=>"<li><b>"+esc(s)+"</b> <pre>"+esc(JSON.stringify(ref(r.content?.["application/json"]?.schema??{}),null,1))+"</pre></li>").join("");
      html+="<details><summary><span class='m "+method+"'>"+method+"</span><code>"+esc(path)+"</code> "+esc(op.summary||"")+(pub.has(path)?" <span class=muted>(public)</span>":"")+"</summary>"
        +(params?"<h4>Parameters</h4><ul>"+params+"</ul>":"")
        +(body?"<h4>Body</h4><pre>"+esc(JSON.stringify(body,null,1))+"</pre>":"")
        +"<h4>Responses</h4><ul>"+responses+"</ul></details>";
    }
  }
  document.getElementById("ops").innerHTML=html;
}).catch(e=>{document.getElementById("ops").textContent="Could not load the contract: "+e});
</script></body></html>`;
}

function escapeHtml(text: string): string {
  return text.replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c] ?? c);
}
