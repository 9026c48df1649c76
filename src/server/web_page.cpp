// The chat page served at "/": one self-contained HTML file (no external assets), talking to
// /v1/chat/completions with streaming. Text is inserted with textContent, never as HTML.
#include "server/api.h"

namespace qwen36::server {

const char* const kWebPage = R"QWEN36PAGE(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>qwen36 chat</title>
<style>
body{font-family:system-ui,sans-serif;margin:0;display:flex;flex-direction:column;height:100vh;background:#fafafa}
header{padding:8px 12px;background:#222;color:#eee;display:flex;gap:12px;align-items:center;flex-wrap:wrap;font-size:13px}
header input{width:60px}#key{width:140px}
#log{flex:1;overflow:auto;padding:12px}
.msg{max-width:800px;margin:8px auto;padding:8px 12px;border-radius:8px;white-space:pre-wrap}
.user{background:#dbeafe}.assistant{background:#fff;border:1px solid #ddd}
details{color:#666;font-size:90%}pre{background:#f3f3f3;padding:6px;overflow:auto}
.tool{font-family:monospace;background:#fef3c7;padding:4px;margin-top:4px}
.err{color:#b91c1c}
form{display:flex;gap:8px;padding:12px;max-width:824px;margin:0 auto;width:100%;box-sizing:border-box}
textarea{flex:1;height:60px}
</style></head><body>
<header><b>qwen36</b>
<label>temperature <input id="temp" type="number" step="0.1" min="0" max="2" value="0.7"></label>
<label>top_p <input id="topp" type="number" step="0.05" min="0" max="1" value="0.95"></label>
<label>max tokens <input id="maxt" type="number" min="1" value="512"></label>
<label><input id="think" type="checkbox" checked> thinking</label>
<label>API key <input id="key" type="password"></label>
<button id="clear" type="button">new chat</button></header>
<div id="log"></div>
<form id="f"><textarea id="in" placeholder="Message (Enter to send, Shift+Enter for a new line)"></textarea>
<button id="send">Send</button><button id="stop" type="button" disabled>Stop</button></form>
<script>
const $=id=>document.getElementById(id);let history=[],ctrl=null;
function box(cls){const d=document.createElement('div');d.className='msg '+cls;$('log').appendChild(d);return d}
function render(el,text){el.textContent='';const parts=text.split('```');parts.forEach((p,i)=>{if(i%2){const pre=document.createElement('pre');pre.textContent=p.replace(/^\w*\n/,'');el.appendChild(pre)}else el.appendChild(document.createTextNode(p))})}
$('clear').onclick=()=>{history=[];$('log').textContent=''};
$('in').onkeydown=e=>{if(e.key==='Enter'&&!e.shiftKey){e.preventDefault();$('f').requestSubmit()}};
$('stop').onclick=()=>{if(ctrl)ctrl.abort()};
$('f').onsubmit=async e=>{e.preventDefault();const text=$('in').value.trim();if(!text||ctrl)return;$('in').value='';
 history.push({role:'user',content:text});box('user').textContent=text;
 const a=box('assistant'),det=document.createElement('details'),sum=document.createElement('summary'),rs=document.createElement('div'),body=document.createElement('div'),tools=document.createElement('div');
 sum.textContent='reasoning';det.appendChild(sum);det.appendChild(rs);det.style.display='none';a.append(det,body,tools);
 let content='',reasoning='',calls=[];ctrl=new AbortController();$('stop').disabled=false;$('send').disabled=true;
 const headers={'Content-Type':'application/json'};if($('key').value)headers.Authorization='Bearer '+$('key').value;
 try{const r=await fetch('/v1/chat/completions',{method:'POST',headers,signal:ctrl.signal,body:JSON.stringify({messages:history,stream:true,
   temperature:+$('temp').value,top_p:+$('topp').value,max_tokens:+$('maxt').value,chat_template_kwargs:{enable_thinking:$('think').checked}})});
  if(!r.ok){const j=await r.json().catch(()=>({error:{message:r.statusText}}));throw new Error(j.error.message)}
  const rd=r.body.getReader(),dec=new TextDecoder();let buf='';
  for(;;){const {value,done}=await rd.read();if(done)break;buf+=dec.decode(value,{stream:true});let i;
   while((i=buf.indexOf('\n\n'))>=0){const ev=buf.slice(0,i);buf=buf.slice(i+2);if(!ev.startsWith('data: '))continue;const d=ev.slice(6);if(d==='[DONE]')continue;
    const j=JSON.parse(d);if(j.error)throw new Error(j.error.message);const ch=j.choices&&j.choices[0];if(!ch)continue;const dl=ch.delta||{};
    if(dl.reasoning_content){reasoning+=dl.reasoning_content;det.style.display='';rs.textContent=reasoning}
    if(dl.content){content+=dl.content;render(body,content)}
    (dl.tool_calls||[]).forEach(t=>{calls.push(t);const p=document.createElement('div');p.className='tool';p.textContent='tool call: '+t.function.name+'('+t.function.arguments+')';tools.appendChild(p)});
    $('log').scrollTop=$('log').scrollHeight}}
 }catch(err){if(err.name!=='AbortError'){const p=document.createElement('div');p.className='err';p.textContent=String(err.message||err);a.appendChild(p)}}
 const m={role:'assistant',content};if(calls.length)m.tool_calls=calls.map(c=>({id:c.id,type:'function',function:c.function}));history.push(m);
 ctrl=null;$('stop').disabled=true;$('send').disabled=false};
</script></body></html>
)QWEN36PAGE";

}  // namespace qwen36::server
